package workspace_test

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestGrepGenericLines(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	files := map[string]string{
		"crlf.txt": "one\r\ntwo\r\nthree\r\n",
		"long.txt": "aaaaaaaaaaX\nshort X\n",
		"ctx.txt":  "1\n2\nhit\n4\n5\n6\nhit\n8\n",
		"bin.dat":  "hit\x00hit\n",
	}
	for name, data := range files {
		if err := fsys.WriteFile(ctx, name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		req  workspace.GrepRequest
		want []workspace.GrepLine
		more bool
	}{
		{"anchored on CRLF", workspace.GrepRequest{Pattern: "^two$", Dir: "crlf.txt"},
			[]workspace.GrepLine{{Path: "crlf.txt", Line: 2, Text: "two", Match: true}}, false},
		{"cut before matching", workspace.GrepRequest{Pattern: "X", Dir: "long.txt", MaxLineChars: 5},
			[]workspace.GrepLine{{Path: "long.txt", Line: 2, Text: "short", Match: false}}[:0], false},
		{"cut line anchored", workspace.GrepRequest{Pattern: "a$", Dir: "long.txt", MaxLineChars: 5},
			[]workspace.GrepLine{{Path: "long.txt", Line: 1, Text: "aaaaa", Match: true}}, false},
		{"context merges", workspace.GrepRequest{Pattern: "hit", Dir: "ctx.txt", Context: 1},
			[]workspace.GrepLine{
				{Path: "ctx.txt", Line: 2, Text: "2"}, {Path: "ctx.txt", Line: 3, Text: "hit", Match: true}, {Path: "ctx.txt", Line: 4, Text: "4"},
				{Path: "ctx.txt", Line: 6, Text: "6"}, {Path: "ctx.txt", Line: 7, Text: "hit", Match: true}, {Path: "ctx.txt", Line: 8, Text: "8"},
			}, false},
		{"limit trims the dropped match's context", workspace.GrepRequest{Pattern: "hit", Dir: "ctx.txt", Context: 1, Limit: 1},
			[]workspace.GrepLine{{Path: "ctx.txt", Line: 2, Text: "2"}, {Path: "ctx.txt", Line: 3, Text: "hit", Match: true}, {Path: "ctx.txt", Line: 4, Text: "4"}}, true},
		{"binary skipped", workspace.GrepRequest{Pattern: "hit", Glob: "*.dat"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := workspace.GrepGeneric(ctx, fsys, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Lines) != len(tt.want) || got.Truncated != tt.more {
				t.Fatalf("got %+v (truncated %v), want %+v (truncated %v)", got.Lines, got.Truncated, tt.want, tt.more)
			}
			for i := range got.Lines {
				if got.Lines[i] != tt.want[i] {
					t.Errorf("line %d: got %+v, want %+v", i, got.Lines[i], tt.want[i])
				}
			}
		})
	}
}
