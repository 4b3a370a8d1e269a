package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestSoakMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("a soak takes about 12 s (its settling waits), even short")
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), stdio{strings.NewReader(""), &out, &errOut}, []string{"soak", "--backend", "memory", "--sessions", "30", "--concurrency", "3"})
	if code != 0 {
		t.Fatalf("soak: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"before: goroutines", "after:  goroutines", "30 sessions in", "0 failed unexpectedly"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("soak output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestSoakUsage(t *testing.T) {
	for _, args := range [][]string{
		{"soak", "--sessions", "0"},
		{"soak", "--concurrency", "0"},
		{"soak", "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), stdio{strings.NewReader(""), &out, &errOut}, args); code != 2 {
			t.Errorf("%q: exit %d, want 2: %s", args, code, errOut.String())
		}
	}
}
