package delivery_test

import (
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/delivery"
)

// TestChangesSkipped: a path one tree skipped (too large, unreadable) is
// not known there, so it is neither deleted nor added.
func TestChangesSkipped(t *testing.T) {
	a, b := delivery.Entry{Mode: 0o644, OID: "a"}, delivery.Entry{Mode: 0o644, OID: "b"}
	for _, tc := range []struct {
		name        string
		base, final *delivery.Tree
		want        []string
	}{
		{"skipped at the end", &delivery.Tree{Files: map[string]delivery.Entry{"big": a, "gone": a}},
			&delivery.Tree{Files: map[string]delivery.Entry{}, Skipped: map[string]string{"big": "over 1 GiB"}}, []string{"gone"}},
		{"skipped at the start", &delivery.Tree{Files: map[string]delivery.Entry{}, Skipped: map[string]string{"big": "unreadable"}},
			&delivery.Tree{Files: map[string]delivery.Entry{"big": b, "new": b}}, []string{"new"}},
		{"modified", &delivery.Tree{Files: map[string]delivery.Entry{"f": a}}, &delivery.Tree{Files: map[string]delivery.Entry{"f": b}}, []string{"f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range delivery.Changes(tc.base, tc.final) {
				got = append(got, c.Path)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("changes %v, want %v", got, tc.want)
			}
		})
	}
}
