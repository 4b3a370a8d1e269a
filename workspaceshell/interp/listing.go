package interp

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// pwdFlags: -L and -P change nothing, the workspace having no links above
// its root to resolve.
var pwdFlags = flagSpec[struct{}]{bools: "LP"}

func cmdPwd(c *call) int {
	if _, st, ok := parseFlags(c, &pwdFlags, &struct{}{}); !ok {
		return st
	}
	c.print(c.r.root + "\n")
	return 0
}

// ---- ls

var lsFlags = flagSpec[lsOptions]{
	bools: "aAlR1dFphrtSU",
	long: map[string]string{"all": "a", "almost-all": "A", "recursive": "R", "directory": "d", "classify": "F",
		"human-readable": "h", "reverse": "r", "color": "color?", "group-directories-first": "gdf"},
	set: map[string]setter[lsOptions]{
		"a": on(func(o *lsOptions) { o.all = true }), "A": on(func(o *lsOptions) { o.almost = true }),
		"l": on(func(o *lsOptions) { o.long = true }), "R": on(func(o *lsOptions) { o.recursive = true }),
		"d": on(func(o *lsOptions) { o.dirOnly = true }), "F": on(func(o *lsOptions) { o.classify = true }),
		"p": on(func(o *lsOptions) { o.slash = true }), "h": on(func(o *lsOptions) { o.human = true }),
		"r": on(func(o *lsOptions) { o.reverse = true }), "t": on(func(o *lsOptions) { o.byTime = true }),
		"S": on(func(o *lsOptions) { o.bySize = true }), "U": on(func(o *lsOptions) { o.unsorted = true }),
		"gdf": on(func(o *lsOptions) { o.dirsFirst = true }),
	},
}

type lsOptions struct {
	all, almost, long, recursive, dirOnly, classify, slash, human, reverse, byTime, bySize, unsorted, dirsFirst bool
}

type lsEntry struct {
	name string // as shown
	ws   string // workspace name
	info fs.FileInfo
}

func cmdLs(c *call) int {
	var o lsOptions
	ops, st, ok := parseFlags(c, &lsFlags, &o)
	if !ok {
		return st
	}
	if len(ops) == 0 {
		ops = []string{"."}
	}
	status := 0
	var files, dirs []lsEntry
	for _, a := range ops {
		name, err := c.resolve(a)
		var info fs.FileInfo
		if err == nil {
			info, err = c.r.env.FS.Lstat(c.ctx, name)
		}
		if err != nil {
			c.errorf("cannot access '%s': %s", a, ErrorText(err))
			status = 2
			continue
		}
		if info.Mode()&fs.ModeSymlink != 0 && !o.long && !o.dirOnly && !o.classify {
			if ti, err := c.r.env.FS.Stat(c.ctx, name); err == nil && ti.IsDir() {
				info = ti
			}
		}
		e := lsEntry{name: a, ws: name, info: info}
		if info.IsDir() && !o.dirOnly {
			dirs = append(dirs, e)
		} else {
			files = append(files, e)
		}
	}
	o.sort(files)
	o.sort(dirs)
	c.lsPrint(files, o)
	for i, d := range dirs {
		if len(ops) > 1 || o.recursive {
			if i > 0 || len(files) > 0 {
				c.print("\n")
			}
			c.print(d.name + ":\n")
		}
		if s := c.lsDir(d, o); s > status {
			status = s
		}
		if c.stopped() {
			break
		}
	}
	return status
}

func (o lsOptions) sort(es []lsEntry) {
	if o.unsorted {
		return
	}
	slices.SortStableFunc(es, func(a, b lsEntry) int {
		if o.dirsFirst && a.info.IsDir() != b.info.IsDir() {
			if a.info.IsDir() {
				return -1
			}
			return 1
		}
		r := strings.Compare(a.name, b.name)
		switch {
		case o.byTime:
			if d := b.info.ModTime().Compare(a.info.ModTime()); d != 0 {
				r = d
			}
		case o.bySize:
			if d := b.info.Size() - a.info.Size(); d != 0 {
				r = int(max(-1, min(1, d)))
			}
		}
		if o.reverse {
			r = -r
		}
		return r
	})
}

// lsDir lists one directory (and, with -R, those below it, an excluded
// name listed but not entered), all described by one workspace.Walk.
func (c *call) lsDir(d lsEntry, o lsOptions) int {
	req := workspace.WalkRequest{Dir: d.ws, Info: true, Errors: true, MaxDepth: 1}
	if o.recursive {
		req.MaxDepth, req.Exclude, req.ListExcluded = 0, c.r.env.exclude(), true
	}
	w, err := workspace.Walk(c.ctx, c.r.env.FS, req)
	if err != nil {
		c.errorf("cannot open directory '%s': %s", d.name, ErrorText(err))
		return 2
	}
	t := lsTree{entries: map[string][]workspace.WalkEntry{}, failed: map[string]error{}}
	for _, e := range w.Entries {
		if e.Err != nil {
			t.failed[e.Path] = e.Err
			continue
		}
		t.entries[path.Dir(e.Path)] = append(t.entries[path.Dir(e.Path)], e)
	}
	return c.lsList(d, o, t)
}

// lsTree is what a walk found: the entries of each directory, and the
// directories that could not be read.
type lsTree struct {
	entries map[string][]workspace.WalkEntry
	failed  map[string]error
}

// lsList prints the directory d from t (and, with -R, those below it).
func (c *call) lsList(d lsEntry, o lsOptions, t lsTree) int {
	fsys := c.r.env.FS
	if err := t.failed[d.ws]; err != nil {
		c.errorf("cannot open directory '%s': %s", d.name, ErrorText(err))
		return 2
	}
	var list []lsEntry
	if o.all {
		for _, n := range []string{".", ".."} {
			ws := path.Join(d.ws, n)
			if n == ".." && d.ws == "." {
				ws = "."
			}
			info, err := fsys.Stat(c.ctx, ws)
			if err != nil {
				continue
			}
			list = append(list, lsEntry{name: n, ws: ws, info: info})
		}
	}
	status := 0
	for _, e := range t.entries[d.ws] {
		name := path.Base(e.Path)
		if strings.HasPrefix(name, ".") && !o.all && !o.almost {
			continue
		}
		info, ok := e.FileInfo()
		if !ok { // changed since the listing
			var err error
			if info, err = fsys.Lstat(c.ctx, e.Path); err != nil {
				c.errorf("cannot access '%s': %s", display(d.name, name), ErrorText(err))
				status = 1
				continue
			}
		}
		list = append(list, lsEntry{name: name, ws: e.Path, info: info})
	}
	o.sort(list)
	c.lsPrint(list, o)
	if !o.recursive {
		return status
	}
	for _, e := range list {
		if !e.info.IsDir() || e.name == "." || e.name == ".." || c.r.env.exclude().Skip(e.ws) || c.stopped() {
			continue
		}
		sub := lsEntry{name: display(d.name, e.name), ws: e.ws, info: e.info}
		c.print("\n" + sub.name + ":\n")
		if s := c.lsList(sub, o, t); s > status {
			status = s
		}
	}
	return status
}

func (c *call) lsPrint(list []lsEntry, o lsOptions) {
	if !o.long {
		for _, e := range list {
			if !c.print(e.name + lsSuffix(e.info, o) + "\n") {
				return
			}
		}
		return
	}
	width := 0
	sizes := make([]string, len(list))
	for i, e := range list {
		sizes[i] = strconv.FormatInt(e.info.Size(), 10)
		if o.human {
			sizes[i] = humanSize(e.info.Size())
		}
		width = max(width, len(sizes[i]))
	}
	now := time.Now()
	for i, e := range list {
		name := e.name
		if e.info.Mode()&fs.ModeSymlink != 0 {
			if sl, ok := c.r.env.FS.(workspace.SymlinkFS); ok {
				if t, err := sl.Readlink(c.ctx, e.ws); err == nil {
					name += " -> " + t
				}
			}
		} else {
			name += lsSuffix(e.info, o)
		}
		mt := e.info.ModTime()
		stamp := mt.Format("Jan _2 15:04")
		if mt.Before(now.AddDate(0, -6, 0)) || mt.After(now.Add(time.Hour)) {
			stamp = mt.Format("Jan _2  2006")
		}
		if !c.printf("%s %*s %s %s\n", modeString(e.info.Mode()), width, sizes[i], stamp, name) {
			return
		}
	}
}

func lsSuffix(info fs.FileInfo, o lsOptions) string {
	m := info.Mode()
	switch {
	case m.IsDir() && (o.classify || o.slash):
		return "/"
	case !o.classify:
		return ""
	case m&fs.ModeSymlink != 0:
		return "@"
	case m&fs.ModeNamedPipe != 0:
		return "|"
	case m&fs.ModeSocket != 0:
		return "="
	case m.IsRegular() && m&0o111 != 0:
		return "*"
	}
	return ""
}

// modeString formats mode as ls -l does ("drwxr-xr-x", "lrwxrwxrwx").
func modeString(m fs.FileMode) string {
	b := []byte("-rwxrwxrwx")
	switch {
	case m.IsDir():
		b[0] = 'd'
	case m&fs.ModeSymlink != 0:
		b[0] = 'l'
	case m&fs.ModeNamedPipe != 0:
		b[0] = 'p'
	case m&fs.ModeSocket != 0:
		b[0] = 's'
	case m&fs.ModeCharDevice != 0:
		b[0] = 'c'
	case m&fs.ModeDevice != 0:
		b[0] = 'b'
	}
	for i := 0; i < 9; i++ {
		if m&(1<<(8-i)) == 0 {
			b[i+1] = '-'
		}
	}
	special := func(i int, set bool, lower, upper byte) {
		if set {
			if b[i] == '-' {
				b[i] = upper
			} else {
				b[i] = lower
			}
		}
	}
	special(3, m&fs.ModeSetuid != 0, 's', 'S')
	special(6, m&fs.ModeSetgid != 0, 's', 'S')
	special(9, m&fs.ModeSticky != 0, 't', 'T')
	return string(b)
}

func humanSize(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10)
	}
	f := float64(n)
	for _, u := range "KMGTPE" {
		f /= 1024
		if f < 1024 || u == 'E' {
			if f < 10 {
				return fmt.Sprintf("%.1f%c", float64(int(f*10+0.999))/10, u)
			}
			return fmt.Sprintf("%d%c", int(f+0.999), u)
		}
	}
	return strconv.FormatInt(n, 10)
}
