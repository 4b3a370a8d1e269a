package journal

import (
	"cmp"
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/workspace"
)

// Contents returns the bytes of a file state the journal keeps (a Change's
// Before or After), checked against their SHA-256 as Revert checks them: a
// copy that no longer matches fails with workspace.ErrUnavailable. A state
// that is not a file fails with workspace.ErrInvalidArgument; a file whose
// contents were not kept (over MaxBlobBytes) with workspace.ErrFileTooLarge.
func (j *Journal) Contents(ctx context.Context, e Entry) ([]byte, error) {
	switch {
	case e.Type != "file":
		return nil, workspace.Errorf(workspace.ErrInvalidArgument, "journal: a %s state has no contents", cmp.Or(e.Type, "absent"))
	case e.Hash == "" && e.Size == 0:
		return []byte{}, nil
	case e.Hash == "":
		return nil, workspace.Errorf(workspace.ErrFileTooLarge, "journal: the contents (%d bytes) were not kept: over the journal's cap of %d bytes", e.Size, j.maxBlob)
	}
	data, err := j.readBlob(ctx, e.Hash)
	if err != nil {
		return nil, fmt.Errorf("journal: contents %s: %w", e.Hash[:min(len(e.Hash), 12)], err)
	}
	return data, nil
}
