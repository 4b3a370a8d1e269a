package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// The commits' records are appended to segments: files of the commits'
// directory named by the first commit they hold ("00000001.log"), one JSON
// record a line, each ended by a newline. A commit so costs the store one
// append (workspace.AppendFile: a write to an open file on a store that is
// a workspace.AppendFS, such as localfs) rather than a file created; a new
// segment is begun after segmentCommits records or segmentBytes bytes, and
// a segment is removed once every commit in it is pruned. A record is
// complete with its newline: a line cut short (a crash, a failed append) is
// not a commit, and is cut off before the next append. Records of earlier
// versions, one file each ("00000001.json"), are read as well.
const (
	segmentCommits = 64
	segmentBytes   = 1 << 20
	// maxRecordFile bounds a file of records read back.
	maxRecordFile = 64 << 20
)

// segment is the one commits are appended to.
type segment struct {
	first int   // its first commit's ID; 0 when there is none yet
	count int   // the records in it
	size  int64 // the bytes of its complete records
	// dirty says the file may be longer than size (a record cut short),
	// to be cut back before the next append.
	dirty bool
}

func (j *Journal) segmentName(first int) string {
	return path.Join(j.commitsDir(), fmt.Sprintf("%08d.log", first))
}

// load reads the commits kept in the store, for Open, and keeps the last
// maxCommits of them.
func (j *Journal) load(ctx context.Context) error {
	entries, err := j.store.ReadDir(ctx, j.commitsDir())
	if errors.Is(err, workspace.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	for _, e := range entries {
		base, ext := strings.CutSuffix(e.Name(), ".json")
		if !ext {
			if base, ext = strings.CutSuffix(e.Name(), ".log"); !ext {
				continue
			}
		}
		id, err := strconv.Atoi(base)
		if err != nil || id < 1 {
			continue
		}
		if strings.HasSuffix(e.Name(), ".json") {
			err = j.loadFile(ctx, id)
		} else {
			err = j.loadSegment(ctx, id)
		}
		if err != nil {
			return err
		}
	}
	slices.SortFunc(j.commits, func(a, b *Commit) int { return a.ID - b.ID })
	for i := 1; i < len(j.commits); i++ {
		if j.commits[i].ID == j.commits[i-1].ID {
			return fmt.Errorf("journal: commit %d is recorded twice: move %s aside to start a new journal", j.commits[i].ID, j.commitsDir())
		}
	}
	if n := len(j.commits); n > 0 {
		j.nextID = j.commits[n-1].ID + 1
	}
	j.prune(ctx)
	return nil
}

// loadFile loads the record of commit id kept in a file of its own.
func (j *Journal) loadFile(ctx context.Context, id int) error {
	name := j.commitName(id)
	data, err := j.store.ReadFile(ctx, name, maxRecordFile)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	c, err := j.parseRecord(data)
	if err == nil && c.ID != id {
		err = fmt.Errorf("it is commit %d", c.ID)
	}
	if err != nil {
		return fmt.Errorf("journal: commit %d is damaged (%v): move %s aside to start a new journal", id, err, name)
	}
	j.commits = append(j.commits, c)
	return nil
}

// loadSegment loads the records of the segment whose first commit is
// first; a segment later than the one appended to so far becomes it.
func (j *Journal) loadSegment(ctx context.Context, first int) error {
	name := j.segmentName(first)
	data, err := j.store.ReadFile(ctx, name, maxRecordFile)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	seg := segment{first: first}
	prev := first - 1
	for int(seg.size) < len(data) {
		n := bytes.IndexByte(data[seg.size:], '\n') + 1
		if n == 0 { // cut short
			seg.dirty = true
			break
		}
		c, err := j.parseRecord(data[seg.size : seg.size+int64(n)])
		if err == nil && c.ID <= prev {
			err = fmt.Errorf("commit %d after commit %d", c.ID, prev)
		}
		if err != nil {
			return fmt.Errorf("journal: record %d of %s is damaged (%v): move it aside to start a new journal", seg.count+1, name, err)
		}
		c.seg, c.at, c.n = first, int(seg.size), n
		j.commits = append(j.commits, c)
		prev = c.ID
		seg.count++
		seg.size += int64(n)
	}
	if first > j.tail.first {
		j.tail = seg
	}
	return nil
}

// parseRecord decodes one record and registers the contents it holds.
func (j *Journal) parseRecord(data []byte) (*Commit, error) {
	var c Commit
	rec := record{Commit: &c}
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	if !c.wellFormed() {
		return nil, errors.New("a name or hash that is not one")
	}
	for h := range rec.Inline { // checked when read (readBlob)
		j.inlined[h] = c.ID
		c.inline = append(c.inline, h)
	}
	return &c, nil
}

// appendRecord keeps rec in the store, appended to the segment it belongs
// to, and notes where. When the append fails, what it may have left is cut
// off (now, or before the next append).
func (j *Journal) appendRecord(ctx context.Context, rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if t := j.tail; t.first == 0 || t.count >= segmentCommits || t.size >= segmentBytes {
		if t.dirty {
			if err := j.cutTail(ctx); err != nil {
				return err
			}
		}
		j.tail = segment{first: rec.ID}
	}
	if j.tail.dirty {
		if err := j.cutTail(ctx); err != nil {
			return err
		}
	}
	name := j.segmentName(j.tail.first)
	// The commits' directory is made when an append finds it missing, not
	// looked for before each commit.
	err = workspace.AppendFile(ctx, j.store, name, data, 0o600)
	if errors.Is(err, workspace.ErrNotFound) {
		if err = workspace.MkdirAll(ctx, j.store, j.commitsDir(), 0o700); err == nil {
			err = workspace.AppendFile(ctx, j.store, name, data, 0o600)
		}
	}
	if err != nil {
		j.tail.dirty = true
		return errors.Join(err, j.cutTail(ctx))
	}
	rec.seg, rec.at, rec.n = j.tail.first, int(j.tail.size), len(data)
	j.tail.count++
	j.tail.size += int64(len(data))
	return nil
}

// cutTail cuts the segment appended to back to its complete records.
func (j *Journal) cutTail(ctx context.Context) error {
	name := j.segmentName(j.tail.first)
	data, err := j.store.ReadFile(ctx, name, maxRecordFile)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
	case err != nil:
		return err
	case int64(len(data)) <= j.tail.size:
	case j.tail.size == 0:
		err = j.store.Remove(ctx, name)
	default:
		err = j.store.WriteFile(ctx, name, data[:j.tail.size], 0o600)
	}
	if err != nil {
		return err
	}
	j.tail.dirty = false
	return nil
}

// readRecord reads c's record back from the store.
func (j *Journal) readRecord(ctx context.Context, c *Commit) (record, error) {
	name := j.commitName(c.ID)
	if c.seg != 0 {
		name = j.segmentName(c.seg)
	}
	data, err := j.store.ReadFile(ctx, name, maxRecordFile)
	if err != nil {
		return record{}, err
	}
	if c.seg != 0 {
		if c.at+c.n > len(data) {
			return record{}, errAltered
		}
		data = data[c.at : c.at+c.n]
	}
	var got Commit
	rec := record{Commit: &got}
	if err := json.Unmarshal(data, &rec); err != nil || got.ID != c.ID {
		return record{}, errAltered
	}
	return rec, nil
}
