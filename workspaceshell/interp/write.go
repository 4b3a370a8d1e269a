package interp

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// ---- the shell's write commands: front ends of the operations above with
// coreutils' arguments and messages.

var mkdirFlags = flagSpec[mkdirOptions]{bools: "pv", values: "m", long: map[string]string{"parents": "p", "verbose": "v", "mode": "m="},
	set: map[string]setter[mkdirOptions]{
		"p": on(func(o *mkdirOptions) { o.parents = true }),
		"v": on(func(o *mkdirOptions) { o.verbose = true }),
		"m": func(_ *call, o *mkdirOptions, _, val string) error {
			n, err := strconv.ParseUint(val, 8, 32)
			if err != nil || n > 0o7777 {
				return usagef("invalid mode '%s' (an octal mode is expected)", val)
			}
			o.perm = fs.FileMode(n).Perm()
			return nil
		},
	}}

// mkdirOptions are mkdir's options: -p, -v, -m.
type mkdirOptions struct {
	parents bool
	verbose bool
	perm    fs.FileMode
}

func cmdMkdir(c *call) int {
	o := mkdirOptions{perm: 0o755}
	ops, st, ok := parseFlags(c, &mkdirFlags, &o)
	if !ok {
		return st
	}
	if len(ops) == 0 {
		return c.usage("missing operand")
	}
	m := c.r.mutator()
	status := 0
	for _, a := range ops {
		name, err := m.Target(c.ctx, a)
		if err == nil {
			if o.parents {
				err = workspace.MkdirAll(c.ctx, m.fs, name, o.perm)
			} else {
				err = m.fs.Mkdir(c.ctx, name, o.perm)
			}
		}
		if err != nil {
			c.errorf("cannot create directory '%s': %s", a, ErrorText(err))
			status = 1
			continue
		}
		if o.verbose {
			c.printf("mkdir: created directory '%s'\n", a)
		}
	}
	return status
}

// touchFlags: -a and -m change nothing, the port having no way to set a
// file's times.
var touchFlags = flagSpec[touchOptions]{bools: "cam", long: map[string]string{"no-create": "c"},
	set: map[string]setter[touchOptions]{"c": on(func(o *touchOptions) { o.noCreate = true })}}

// touchOptions are touch's options: -c.
type touchOptions struct{ noCreate bool }

// cmdTouch creates missing files. An existing file is left as it is: the
// FileSystem port has no way to set a file's times.
func cmdTouch(c *call) int {
	var o touchOptions
	ops, st, ok := parseFlags(c, &touchFlags, &o)
	if !ok {
		return st
	}
	noCreate := o.noCreate
	if len(ops) == 0 {
		return c.usage("missing file operand")
	}
	m := c.r.mutator()
	status := 0
	for _, a := range ops {
		name, err := m.Target(c.ctx, a)
		if err == nil {
			_, err = m.fs.Stat(c.ctx, name)
			if errors.Is(err, workspace.ErrNotFound) {
				err = nil
				if !noCreate {
					_, err = m.WriteFile(c.ctx, name, nil, false)
				}
			}
		}
		if err != nil {
			c.errorf("cannot touch '%s': %s", a, ErrorText(err))
			status = 1
		}
	}
	return status
}

var cpFlags = flagSpec[cpOptions]{bools: "rRafnvpPdT", long: map[string]string{"recursive": "r", "archive": "a", "force": "f",
	"no-clobber": "n", "verbose": "v", "no-dereference": "P", "no-target-directory": "T", "preserve": "p?"},
	set: map[string]setter[cpOptions]{
		"r": on(func(o *cpOptions) { o.recursive = true }), "R": on(func(o *cpOptions) { o.recursive = true }),
		"a": on(func(o *cpOptions) { o.recursive, o.noDeref = true, true }),
		"n": on(func(o *cpOptions) { o.noClobber = true }), "v": on(func(o *cpOptions) { o.verbose = true }),
		"T": on(func(o *cpOptions) { o.noTarget = true }),
		"P": on(func(o *cpOptions) { o.noDeref = true }), "d": on(func(o *cpOptions) { o.noDeref = true }),
	}}

var mvFlags = flagSpec[mvOptions]{bools: "fnvT", long: map[string]string{"force": "f", "no-clobber": "n", "verbose": "v",
	"no-target-directory": "T"},
	set: map[string]setter[mvOptions]{
		"n": on(func(o *mvOptions) { o.noClobber = true }), "v": on(func(o *mvOptions) { o.verbose = true }),
		"T": on(func(o *mvOptions) { o.noTarget = true }),
	}}

// copyMoveArgs sorts cp's and mv's operands into sources and destinations:
// into a directory when the last operand is one, else one source to a path.
func (c *call) copyMoveArgs(ops []string, noTarget bool) (srcs []string, dest func(src string) (string, string, error), ok bool) {
	if len(ops) == 0 {
		c.errorf("missing file operand")
		return nil, nil, false
	}
	if len(ops) == 1 {
		c.errorf("missing destination file operand after '%s'", ops[0])
		return nil, nil, false
	}
	last := ops[len(ops)-1]
	srcs = ops[:len(ops)-1]
	m := c.r.mutator()
	dname, err := workspace.Resolve(m.root, last)
	intoDir := false
	if err == nil && !noTarget {
		if info, serr := m.fs.Stat(c.ctx, dname); serr == nil && info.IsDir() {
			intoDir = true
		}
	}
	if len(srcs) > 1 && !intoDir {
		c.errorf("target '%s' is not a directory", last)
		return nil, nil, false
	}
	return srcs, func(src string) (string, string, error) {
		arg := last
		if intoDir {
			arg = display(last, baseName(src))
		}
		name, err := m.Target(c.ctx, arg)
		return name, arg, err
	}, true
}

// cpOptions are cp's options: -r, -n, -v, -T, -P (-a sets -r and -P).
type cpOptions struct {
	recursive bool
	noClobber bool
	verbose   bool
	noTarget  bool
	noDeref   bool
}

func cmdCp(c *call) int {
	var o cpOptions
	ops, st, ok := parseFlags(c, &cpFlags, &o)
	if !ok {
		return st
	}
	srcs, dest, ok := c.copyMoveArgs(ops, o.noTarget)
	if !ok {
		return 1
	}
	m := c.r.mutator()
	status := 0
	for _, src := range srcs {
		if c.stopped() {
			break
		}
		follow := !o.recursive && !o.noDeref
		from, err := workspace.Resolve(m.root, src)
		var info fs.FileInfo
		if err == nil {
			info, err = m.lstatOrStat(c.ctx, from, follow)
		}
		if err != nil {
			c.errorf("cannot stat '%s': %s", src, ErrorText(err))
			status = 1
			continue
		}
		if info.IsDir() && !o.recursive {
			c.errorf("-r not specified; omitting directory '%s'", src)
			status = 1
			continue
		}
		to, toArg, err := dest(src)
		if err != nil {
			c.errorf("cannot create '%s': %s", toArg, ErrorText(err))
			status = 1
			continue
		}
		if to == from || strings.HasPrefix(to, from+"/") {
			c.errorf("cannot copy '%s' into itself, '%s'", src, toArg)
			status = 1
			continue
		}
		if ti, err := m.fs.Stat(c.ctx, to); err == nil {
			if o.noClobber {
				continue
			}
			if ti.IsDir() && !info.IsDir() {
				c.errorf("cannot overwrite directory '%s' with non-directory", toArg)
				status = 1
				continue
			}
		}
		if _, err := m.Copy(c.ctx, from, to, follow); err != nil {
			c.errorf("cannot copy '%s' to '%s': %s", src, toArg, ErrorText(err))
			status = 1
			continue
		}
		if o.verbose {
			c.printf("'%s' -> '%s'\n", src, toArg)
		}
	}
	return status
}

// mvOptions are mv's options: -n, -v, -T.
type mvOptions struct {
	noClobber bool
	verbose   bool
	noTarget  bool
}

func cmdMv(c *call) int {
	var o mvOptions
	ops, st, ok := parseFlags(c, &mvFlags, &o)
	if !ok {
		return st
	}
	srcs, dest, ok := c.copyMoveArgs(ops, o.noTarget)
	if !ok {
		return 1
	}
	m := c.r.mutator()
	status := 0
	for _, src := range srcs {
		if c.stopped() {
			break
		}
		from, err := m.Target(c.ctx, src)
		var info fs.FileInfo
		if err == nil {
			info, err = m.fs.Lstat(c.ctx, from)
		}
		if err != nil {
			c.errorf("cannot move '%s': %s", src, ErrorText(err))
			status = 1
			continue
		}
		to, toArg, err := dest(src)
		if err == nil {
			err = c.mvClear(info, to, toArg, o.noClobber)
		}
		if err == errSkip {
			continue
		}
		if err == nil {
			err = m.Move(c.ctx, from, to)
		}
		if err != nil {
			c.errorf("cannot move '%s' to '%s': %s", src, toArg, ErrorText(err))
			status = 1
			continue
		}
		if o.verbose {
			c.printf("renamed '%s' -> '%s'\n", src, toArg)
		}
	}
	return status
}

var errSkip = errors.New("skip")

// mvClear makes way for a move onto to: an empty directory is replaced by a
// directory, a file by a file; anything else is refused.
func (c *call) mvClear(src fs.FileInfo, to, toArg string, noClobber bool) error {
	fsys := c.r.env.FS
	ti, err := fsys.Lstat(c.ctx, to)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return nil
	case err != nil:
		return err
	case noClobber:
		return errSkip
	case ti.IsDir() && !src.IsDir():
		return workspace.Errorf(workspace.ErrExists, "cannot overwrite directory '%s' with non-directory", toArg)
	case !ti.IsDir() && src.IsDir():
		return workspace.Errorf(workspace.ErrNotADirectory, "cannot overwrite non-directory '%s' with directory", toArg)
	case ti.IsDir():
		if err := fsys.Remove(c.ctx, to); err != nil {
			return err
		}
	}
	return nil
}

var rmFlags = flagSpec[rmOptions]{bools: "rRfdvI", long: map[string]string{"recursive": "r", "force": "f", "dir": "d", "verbose": "v"},
	set: map[string]setter[rmOptions]{
		"r": on(func(o *rmOptions) { o.recursive = true }), "R": on(func(o *rmOptions) { o.recursive = true }),
		"f": on(func(o *rmOptions) { o.force = true }), "d": on(func(o *rmOptions) { o.emptyDirs = true }),
		"v": on(func(o *rmOptions) { o.verbose = true }),
	}}

// rmOptions are rm's options: -r, -f, -d, -v.
type rmOptions struct {
	recursive bool
	force     bool
	emptyDirs bool
	verbose   bool
}

func cmdRm(c *call) int {
	var o rmOptions
	ops, st, ok := parseFlags(c, &rmFlags, &o)
	if !ok {
		return st
	}
	if len(ops) == 0 {
		if o.force {
			return 0
		}
		c.errorf("missing operand")
		return 1
	}
	m := c.r.mutator()
	status := 0
	for _, a := range ops {
		if c.stopped() {
			break
		}
		if b := baseName(a); b == "." || b == ".." {
			c.errorf("refusing to remove '.' or '..' directory: skipping '%s'", a)
			status = 1
			continue
		}
		name, err := m.Target(c.ctx, a)
		var info fs.FileInfo
		if err == nil {
			info, err = m.fs.Lstat(c.ctx, name)
		}
		if errors.Is(err, workspace.ErrNotFound) && o.force {
			continue
		}
		if err == nil && info.IsDir() && !o.recursive && !o.emptyDirs {
			err = workspace.Errorf(workspace.ErrNotAFile, "cannot remove '%s': Is a directory", a)
		}
		if err == nil {
			_, err = m.Remove(c.ctx, name, o.recursive)
		}
		if err != nil {
			if msg, ok := ownMessage(err); ok && strings.HasPrefix(msg, "cannot remove") {
				c.errorf("%s", msg)
			} else {
				c.errorf("cannot remove '%s': %s", a, ErrorText(err))
			}
			status = 1
			continue
		}
		if o.verbose {
			what := "removed"
			if info.IsDir() {
				what = "removed directory"
			}
			c.printf("%s '%s'\n", what, a)
		}
	}
	return status
}
