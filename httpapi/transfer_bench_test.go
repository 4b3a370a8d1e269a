package httpapi

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"runtime"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// heapSampler is a workspace that keeps no file contents and measures the
// live heap (after a collection) at every write: what an upload itself
// holds, at its peak.
type heapSampler struct {
	*memfs.FS
	peak uint64
}

func (h *heapSampler) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.peak = max(h.peak, ms.HeapAlloc)
	runtime.KeepAlive(data) // the file being written counts
	return h.FS.WriteFile(ctx, name, nil, perm)
}

var _ workspace.FileSystem = (*heapSampler)(nil)

// BenchmarkUpload judges and extracts a 32 MiB archive of 16 files and
// reports the heap in use at its peak: with the spool it holds about one
// file's bytes, not the archive's.
func BenchmarkUpload(b *testing.B) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	file := bytes.Repeat([]byte("x"), 2<<20)
	for i := range 16 {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%02d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(file))})
		tw.Write(file)
	}
	tw.Close()
	archive := buf.Bytes()
	ctx := context.Background()
	var peak uint64
	for b.Loop() {
		runtime.GC()
		var base runtime.MemStats
		runtime.ReadMemStats(&base)
		fsys := &heapSampler{FS: memfs.New()}
		spool, err := newSpool()
		if err != nil {
			b.Fatal(err)
		}
		entries, err := readTar(bytes.NewReader(archive), "up", "/workspace", 1<<30, spool)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := extract(ctx, leaseOf(ctx), fsys, "up", entries, spool); err != nil {
			b.Fatal(err)
		}
		spool.Close()
		peak = max(peak, fsys.peak-min(fsys.peak, base.HeapAlloc))
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-live-MiB")
}
