package dockertest

import (
	"archive/tar"
	"context"
	"io"
	"strconv"
	"strings"

	"github.com/moby/moby/client"
)

// Counting is a background command for tests of what outlives the daemon:
// it counts, a line "tick N" a tick of 50ms, and keeps its last count in
// /workspace/n, which Count reads while no daemon is connected.
const Counting = `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo "tick $i"; echo $i > /workspace/n; sleep 0.05; done`

// LastTick is the highest "tick N" line of out, or 0.
func LastTick(out string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if v, err := strconv.Atoi(strings.TrimPrefix(line, "tick ")); err == nil && strings.HasPrefix(line, "tick ") {
			n = max(n, v)
		}
	}
	return n
}

// Count is the last count Counting wrote in container, read through the
// engine's archive API (no command runs in it), or 0 when there is none
// yet.
func Count(ctx context.Context, cli *client.Client, container string) int {
	res, err := cli.CopyFromContainer(ctx, container, client.CopyFromContainerOptions{SourcePath: "/workspace/n"})
	if err != nil {
		return 0
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	if _, err := tr.Next(); err != nil {
		return 0
	}
	data, _ := io.ReadAll(tr)
	n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return n
}
