package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

var fsSpecials = []fsSpecial{
	{name: "ReadFile/TooLargeNotRead", serial: true, run: tooLargeNotRead},
	{name: "WriteFile/CreateMode", needs: needs(CapPermissions), run: createMode},
	{name: "WriteFile/KeepsMode", needs: needs(CapPermissions), run: keepsMode},
	{name: "WriteFile/HardlinkNotWrittenThrough", needs: needs(CapOutside, CapHardlinks), run: hardlinkNotWrittenThrough},
	{name: "WriteFile/Atomic", run: atomicWrites},
	{name: "Concurrent/DistinctFiles", run: distinctFiles},
	{name: "Lock/Counter", run: lockCounter},
	{name: "Lock/Context", run: lockContext},
	{name: "Lock/Independent", run: lockIndependent},
	{name: "Lock/Swap", run: lockSwap},
	{name: "Confine/OutsideUntouched", needs: needs(CapOutside, CapSymlinks), run: outsideUntouched},
	{name: "LongName/PathMax", run: pathMax},
}

// pathMax checks that a name whose path from the root reaches PATH_MAX is
// refused (ErrInvalidArgument) and not made, though each of its elements is
// short, and that the longest path below it is made.
func pathMax(x *fixture) {
	elem := strings.Repeat("p", 200)
	dir := ""
	for {
		next := path.Join(dir, elem)
		if len(x.Root)+1+len(next)+1+2 >= workspace.PathMax {
			break
		}
		if err := x.FS.Mkdir(x.ctx, next, 0o755); err != nil {
			x.t.Fatalf("Mkdir of a path of %d bytes: %v", len(x.Root)+1+len(next), err)
		}
		dir = next
	}
	// The longest name there may be: the path and its NUL are PATH_MAX.
	fill := workspace.PathMax - 1 - (len(x.Root) + 1 + len(dir) + 1)
	ok := path.Join(dir, strings.Repeat("f", fill))
	if err := x.FS.WriteFile(x.ctx, ok, []byte("x"), 0o644); err != nil {
		x.t.Fatalf("WriteFile of a path of %d bytes, PATH_MAX less its NUL: %v", len(x.Root)+1+len(ok), err)
	}
	over := path.Join(dir, strings.Repeat("g", fill+1))
	if msg := invalid.check(x.FS.WriteFile(x.ctx, over, []byte("x"), 0o644)); msg != "" {
		x.t.Errorf("WriteFile of a path of %d bytes: %s", len(x.Root)+1+len(over), msg)
	}
	if _, err := x.FS.Lstat(x.ctx, over); err == nil {
		x.t.Errorf("the path of %d bytes was made", len(x.Root)+1+len(over))
	}
}

func needs(caps ...Capability) []Capability { return caps }

// tooLargeNotRead checks that ReadFile refuses a large file by its size,
// before reading it: the process must not allocate the file's size.
func tooLargeNotRead(x *fixture) {
	const size = 8 << 20
	if err := x.FS.WriteFile(x.ctx, "big", []byte(strings.Repeat("x", size)), 0o644); err != nil {
		x.t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := x.FS.ReadFile(x.ctx, "big", 1024)
	runtime.ReadMemStats(&after)
	if msg := tooLarge.check(err); msg != "" {
		x.t.Fatalf("ReadFile(big, 1024): %s", msg)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > size/2 {
		x.t.Errorf("ReadFile of an %d-byte file with max 1024 allocated %d bytes: it read the file before checking its size", size, n)
	}
}

func expectPerm(x *fixture, name string, want fs.FileMode) {
	x.t.Helper()
	info, err := x.FS.Stat(x.ctx, name)
	if err != nil {
		x.t.Fatal(err)
	}
	if got := info.Mode().Perm(); got != want {
		x.t.Errorf("%s: permissions %v, want %v", name, got, want)
	}
}

func write(x *fixture, name, data string, perm fs.FileMode) {
	x.t.Helper()
	if err := x.FS.WriteFile(x.ctx, name, []byte(data), perm); err != nil {
		x.t.Fatalf("WriteFile(%q): %v", name, err)
	}
}

// createMode checks that a new file gets perm (modes every usual umask
// leaves alone).
func createMode(x *fixture) {
	write(x, "private", "x", 0o600)
	write(x, "script", "x", 0o700)
	expectPerm(x, "private", 0o600)
	expectPerm(x, "script", 0o700)
}

// keepsMode checks that replacing a file keeps its permission bits.
func keepsMode(x *fixture) {
	write(x, "private", "old", 0o600)
	write(x, "script", "old", 0o700)
	write(x, "private", "new", 0o644)
	write(x, "script", "new", 0o644)
	expectPerm(x, "private", 0o600)
	expectPerm(x, "script", 0o700)
	x.expectTree("after replacing", "private: new", "script: new")
}

// hardlinkNotWrittenThrough checks that a file sharing its inode with a file
// outside the workspace is replaced, never written through.
func hardlinkNotWrittenThrough(x *fixture) {
	if err := x.Hardlink("secret", "h"); err != nil {
		x.t.Fatalf("Hardlink: %v", err)
	}
	write(x, "h", "changed", 0o644)
	x.expectTree("after WriteFile(h)", "h: changed")
	x.expectOutside("WriteFile through a hard link")
}

// atomicWrites runs writers of one file against readers, which must only
// ever see one whole version.
func atomicWrites(x *fixture) {
	versions := []string{strings.Repeat("a", 256<<10), strings.Repeat("b", 64<<10), strings.Repeat("c", 1000)}
	write(x, "f", versions[0], 0o644)
	problems := within(x.t, hangTimeout, "concurrent WriteFile and ReadFile", func() []string {
		var (
			mu       sync.Mutex
			problems []string
			reads    int
			stop     = make(chan struct{})
			readers  sync.WaitGroup
			writers  sync.WaitGroup
		)
		report := func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			if len(problems) < 5 {
				problems = append(problems, fmt.Sprintf(format, args...))
			}
		}
		for range 2 {
			readers.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					data, err := x.FS.ReadFile(x.ctx, "f", 1<<20)
					if err != nil {
						report("ReadFile during writes: %v", err)
						return
					}
					mu.Lock()
					reads++
					mu.Unlock()
					if s := string(data); s != versions[0] && s != versions[1] && s != versions[2] {
						report("a reader saw a partial file: %d bytes starting %q", len(data), data[:min(len(data), 8)])
					}
				}
			})
		}
		for w := range 2 {
			writers.Go(func() {
				for i := range 30 {
					if err := x.FS.WriteFile(x.ctx, "f", []byte(versions[(w+i)%3]), 0o644); err != nil {
						report("WriteFile: %v", err)
						return
					}
				}
			})
		}
		writers.Wait()
		close(stop)
		readers.Wait()
		if reads == 0 {
			report("no read completed while the writers ran")
		}
		return problems
	})
	for _, p := range problems {
		x.t.Error(p)
	}
	data, err := x.FS.ReadFile(x.ctx, "f", 1<<20)
	if err != nil {
		x.t.Fatal(err)
	}
	if s := string(data); s != versions[0] && s != versions[1] && s != versions[2] {
		x.t.Errorf("after concurrent writes the file holds %d bytes that are no version written", len(data))
	}
	x.expectTree("after concurrent writes", "f: "+string(data)) // and no temporary file is left
}

// distinctFiles has goroutines create files side by side.
func distinctFiles(x *fixture) {
	const workers, files = 8, 10
	x.build("d/")
	err := within(x.t, hangTimeout, "concurrent WriteFile of distinct files", func() error {
		return inParallel(workers, files, func(w, i int) error {
			name := fmt.Sprintf("d/w%d-%d", w, i)
			return x.FS.WriteFile(x.ctx, name, []byte(name), 0o644)
		})
	})
	if err != nil {
		x.t.Fatal(err)
	}
	var want []string
	for w := range workers {
		for i := range files {
			name := fmt.Sprintf("d/w%d-%d", w, i)
			want = append(want, name+": "+name)
		}
	}
	x.expectTree("after concurrent writes", want...)
}

// lockCounter has goroutines increment a counter in a file under the lock:
// no update may be lost.
func lockCounter(x *fixture) {
	const workers, rounds = 8, 5
	write(x, "counter", "0", 0o644)
	err := within(x.t, hangTimeout, "locked increments", func() error {
		return inParallel(workers, rounds, func(int, int) error { return increment(x.ctx, x.FS, "counter") })
	})
	if err != nil {
		x.t.Fatal(err)
	}
	x.expectTree("after locked increments", "counter: "+strconv.Itoa(workers*rounds))
}

// inParallel runs f(w, 0), …, f(w, rounds-1) on each of workers goroutines
// and returns the first error; a worker stops at its first error.
func inParallel(workers, rounds int, f func(w, i int) error) error {
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				if err := f(w, i); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

func increment(ctx context.Context, fsys workspace.FileSystem, name string) error {
	unlock, err := workspace.Lock(ctx, fsys, name)
	if err != nil {
		return err
	}
	defer unlock()
	data, err := fsys.ReadFile(ctx, name, 100)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(string(data))
	if err != nil {
		return err
	}
	runtime.Gosched() // invite a lost update, should the lock not hold
	return fsys.WriteFile(ctx, name, []byte(strconv.Itoa(n+1)), 0o644)
}

// lockContext checks that waiting for a held lock ends with the context.
func lockContext(x *fixture) {
	unlock, err := workspace.Lock(x.ctx, x.FS, "f")
	if err != nil {
		x.t.Fatal(err)
	}
	err = within(x.t, eventTimeout, "Lock of a held lock with a 100ms context", func() error {
		ctx, cancel := context.WithTimeout(x.ctx, 100*time.Millisecond)
		defer cancel()
		u, err := workspace.Lock(ctx, x.FS, "f")
		if err == nil {
			u()
			return errors.New("took a lock that was held")
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, workspace.ErrTimeout) {
			return fmt.Errorf("failed with %v, want the context's error", err)
		}
		return nil
	})
	if err != nil {
		x.t.Error(err)
	}
	unlock()
	lockAtOnce(x, "f", "a released lock")
}

// lockSwap checks that a swap with Lock waits for a lock that is held, and
// writes once it is released.
func lockSwap(x *fixture) {
	x.build("f: old")
	unlock, err := workspace.Lock(x.ctx, x.FS, "f")
	if err != nil {
		x.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := workspace.Swap(x.ctx, x.FS, workspace.SwapRequest{Name: "f", Data: []byte("new"), Perm: 0o644, Root: x.Root, Lock: true})
		done <- err
	}()
	select {
	case err := <-done:
		x.t.Errorf("a swap with Lock ended (%v) while the lock was held", err)
	case <-time.After(100 * time.Millisecond):
		x.expectTree("while a swap waits for the lock", "f: old")
	}
	unlock()
	err = within(x.t, eventTimeout, "Swap with Lock once the lock is released", func() error { return <-done })
	if err != nil {
		x.t.Fatal(err)
	}
	x.expectTree("after a swap that waited for the lock", "f: new")
	lockAtOnce(x, "f", "a lock a swap held")
}

// lockAtOnce fails the test unless name's lock can be taken (and released)
// at once.
func lockAtOnce(x *fixture, name, what string) {
	x.t.Helper()
	err := within(x.t, eventTimeout, fmt.Sprintf("Lock(%q) of %s", name, what), func() error {
		u, err := workspace.Lock(x.ctx, x.FS, name)
		if err == nil {
			u()
		}
		return err
	})
	if err != nil {
		x.t.Errorf("Lock(%q) of %s: %v", name, what, err)
	}
}

// lockIndependent checks that locks of different names do not block each other.
func lockIndependent(x *fixture) {
	unlock, err := workspace.Lock(x.ctx, x.FS, "a")
	if err != nil {
		x.t.Fatal(err)
	}
	defer unlock()
	lockAtOnce(x, "b", "a free name while another is held")
}

// outsideUntouched tries every mutation through links that leave the
// workspace, then checks that the outside is as the kit made it.
func outsideUntouched(x *fixture) {
	x.build("f: x", "lf => $OUTSIDE/secret", "ld => $OUTSIDE/sd", "lr => $OUT/sd", "ln => $OUTSIDE/new", "d/up => ../..")
	attempts := []op{
		writeFile("lf", "pwned"), writeFile("ld/f", "pwned"), writeFile("ld/new", "pwned"),
		writeFile("lr/new", "pwned"), writeFile("ln", "pwned"), writeFile("d/up/"+relPath(path.Dir(x.Root), x.vars["$OUTSIDE"])+"/secret", "pwned"),
		mkdir("ld/x"), mkdirAll("ld/y/z"), remove("ld/f"), removeAll("ld/f"),
		rename("ld/f", "g"), rename("f", "ld/f"), rename("f", "lr/f"), symlink("x", "ld/l"),
	}
	for _, a := range attempts {
		res := within(x.t, hangTimeout, a.desc, func() error { _, err := a.run(x.ctx, x); return err })
		if res == nil {
			x.t.Errorf("%s succeeded through a link leading out of the workspace", a.desc)
		}
	}
	x.expectOutside("mutations through links out")
}
