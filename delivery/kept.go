package delivery

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A tree kept in a directory of its own (KeepTree, ReadKeptTree) outlives
// the process that read it: a session host keeps a session's first tree
// so, for the diff of the session's next run. Its contents are a Store
// kept in the same directory (OpenStore):
//
//	dir/tree.json  the tree, with the SHA-256 of its encoding
//	dir/objects/   its files' contents, by object name (BlobOID)
//
// A kept tree is read back only when whole and unchanged; its contents
// are checked against their object names as they are read (CheckedGet).

// ErrDamaged: a kept tree, or a content it names, is not what was kept —
// cut short, altered or missing. Match it with errors.Is.
var ErrDamaged = errors.New("delivery: the kept tree is damaged")

// treeName is the file of a kept tree in its directory.
const treeName = "tree.json"

// keptTree is the file of a kept tree.
type keptTree struct {
	// SHA256 is the SHA-256 of Tree, as written, in hex.
	SHA256 string          `json:"sha256"`
	Tree   json.RawMessage `json:"tree"`
}

// OpenStore opens the store kept in dir, making dir (mode 0700) when it is
// missing: Close leaves it. It holds no lock: whoever keeps dir says who
// uses it.
func OpenStore(dir string) (*Store, error) { return openStore(dir) }

// CheckedGet is Get, checking that the content is the one oid names: one
// that is missing or does not match fails wrapping ErrDamaged.
func (s *Store) CheckedGet(oid string) ([]byte, error) {
	data, err := s.Get(oid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: the content %s is missing", ErrDamaged, short(oid))
	case err != nil:
		return nil, err
	case BlobOID(data) != oid:
		return nil, fmt.Errorf("%w: the content %s (%s) was altered", ErrDamaged, short(oid), s.path(oid))
	}
	return data, nil
}

// KeepTree writes t into dir (made private if missing), whole or not at
// all: a temporary file synced, then renamed into place.
func KeepTree(dir string, t *Tree) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	file, err := json.Marshal(keptTree{SHA256: hex.EncodeToString(sum[:]), Tree: data})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, treeName), file)
}

// ReadKeptTree reads back the tree KeepTree kept in dir. It fails wrapping
// fs.ErrNotExist when dir keeps none, and ErrDamaged, naming the file, when
// the file is not what KeepTree wrote (cut short, altered).
func ReadKeptTree(dir string) (*Tree, error) {
	name := filepath.Join(dir, treeName)
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("delivery: the kept tree: %w", err)
	}
	var kt keptTree
	var t Tree
	err = json.Unmarshal(data, &kt)
	if err == nil {
		sum := sha256.Sum256(kt.Tree)
		if hex.EncodeToString(sum[:]) != kt.SHA256 {
			err = errors.New("its checksum does not match")
		}
	}
	if err == nil {
		err = json.Unmarshal(kt.Tree, &t)
	}
	if err == nil && t.Files == nil {
		err = errors.New("it holds no tree")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s (%v)", ErrDamaged, name, err)
	}
	if t.Skipped == nil {
		t.Skipped = map[string]string{}
	}
	return &t, nil
}
