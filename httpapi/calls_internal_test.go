package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// TestWriteResult: what writeResult and writeStatus stream is the JSON
// that encoding/json makes of the same values.
func TestWriteResult(t *testing.T) {
	data := make([]byte, 100_003)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ended := time.Unix(1700000000, 0).UTC()
	for name, r := range map[string]CallResult{
		"text":       {Content: []Content{{Type: "text", Text: "a <b> & \"c\"\n\x00é"}}, StructuredContent: map[string]any{"k": []any{1.0, "<"}}},
		"image":      {Content: []Content{{Type: "text", Text: "[Image]"}, {Type: "image", Data: data, MIMEType: "image/png"}}, StructuredContent: json.RawMessage(`{"path":"a.png"}`)},
		"error":      {Content: []Content{{Type: "text", Text: "NotFound: x"}}, StructuredContent: map[string]any{}, IsError: true},
		"tiny image": {Content: []Content{{Type: "image", Data: []byte{1}, MIMEType: "image/gif"}}, StructuredContent: nil},
	} {
		t.Run(name, func(t *testing.T) {
			var got bytes.Buffer
			if err := writeResult(&got, r); err != nil {
				t.Fatal(err)
			}
			same(t, got.Bytes(), r)
			st := CallStatus{ID: "call-x", Tool: "read", Started: ended, Done: true, Ended: &ended, Result: &r}
			rec := httptest.NewRecorder()
			writeStatus(rec, st)
			same(t, rec.Body.Bytes(), st)
		})
	}
}

// same fails unless got is JSON of the value v marshals to.
func same(t *testing.T, got []byte, v any) {
	t.Helper()
	want, _ := json.Marshal(v)
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("not JSON: %v: %.300s", err, got)
	}
	json.Unmarshal(want, &w)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("streamed %.300s\nwant %.300s", got, want)
	}
}

// TestClassifyNoSpace: a full workspace (its disk, a memory workspace's
// cap) is 507 NoSpace, as a full snapshot store is, not 400.
func TestClassifyNoSpace(t *testing.T) {
	for _, err := range []error{
		workspace.PathError("upload", "big", workspace.ErrNoSpace),
		fmt.Errorf("copy: %w", &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}),
	} {
		if status, kind := classify(err); status != http.StatusInsufficientStorage || kind != "NoSpace" {
			t.Errorf("classify(%v) = %d %s, want 507 NoSpace", err, status, kind)
		}
	}
}

// BenchmarkWriteResult answers a 4 KB read's result (its text and its
// structured content), as callTool does for each call.
func BenchmarkWriteResult(b *testing.B) {
	text := strings.Repeat(strings.Repeat("x", 63)+"\n", 64)
	r := CallResult{Content: []Content{{Type: "text", Text: text}}, StructuredContent: map[string]any{"path": "f4k.txt", "content": text, "totalLines": 64}}
	b.ReportAllocs()
	for b.Loop() {
		if err := writeResult(io.Discard, r); err != nil {
			b.Fatal(err)
		}
	}
}
