package egress

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// byteCap hands out a session's bytes (Policy.MaxBytes, both ways, all
// connections together) so that the session moves no byte past it: a byte
// is taken before it is passed on — once it has been read, where the proxy
// reads it, or before a splice, where the kernel moves it (held until the
// splice says how much it moved, the rest given back). A take that finds
// bytes held by splices under way waits for them to come back (for
// heldWait at most) rather than falling short, and meanwhile no splice
// holds more; a splice holds its bytes for spliceHold at most while it
// waits for data, so an idle connection holds none of them for long.
type byteCap struct {
	max int64

	mu      sync.Mutex
	moved   int64         // taken: passed on, or held by splices under way
	held    int64         // of moved, held by splices
	waiting int           // takes waiting for held bytes; no splice holds more meanwhile
	back    chan struct{} // closed, and replaced, when held bytes come back
}

func newByteCap(max int64) *byteCap { return &byteCap{max: max, back: make(chan struct{})} }

// spent reports whether no byte is left.
func (c *byteCap) spent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.moved >= c.max
}

// heldWait bounds how long a take waits for bytes splices hold.
const heldWait = 10 * spliceHold

// take takes up to n bytes to pass on and returns how many it got: n, or
// fewer (0 included) once the cap has fewer left.
func (c *byteCap) take(n int64) int64 {
	deadline := time.Now().Add(heldWait)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		left := c.max - c.moved
		if left >= n || c.held == 0 || time.Now().After(deadline) {
			g := max(0, min(n, left))
			c.moved += g
			return g
		}
		// Bytes held by splices may come back: wait for them.
		back := c.back
		c.waiting++
		c.mu.Unlock()
		select {
		case <-back:
		case <-time.After(time.Until(deadline)):
		}
		c.mu.Lock()
		c.waiting--
	}
}

// give gives back n bytes taken and not passed on.
func (c *byteCap) give(n int64) {
	if n > 0 {
		c.mu.Lock()
		c.moved -= n
		c.mu.Unlock()
	}
}

// hold takes n bytes for a splice, or none (false) when fewer are left or
// a take waits for held bytes to come back.
func (c *byteCap) hold(n int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.max-c.moved < n || c.waiting > 0 {
		return false
	}
	c.moved += n
	c.held += n
	return true
}

// release ends a splice's hold of n bytes, of which it moved k.
func (c *byteCap) release(n, k int64) {
	c.mu.Lock()
	c.moved -= n - k
	c.held -= n
	close(c.back)
	c.back = make(chan struct{})
	c.mu.Unlock()
}

// spliceChunk is the most one splice between two sockets moves, and holds
// of the cap, at once.
const spliceChunk = 1 << 20

// spliceHold is how long a splice waits for data while it holds its bytes;
// then it gives back what it did not move and takes them again.
const spliceHold = time.Second

// errCapped is a connection cut at the session's byte cap.
var errCapped = errors.New("the session's egress byte cap is spent")

// pipe copies src to dst until src ends (nil) or either fails, each byte
// taken from m's cap first and counted in dir; the cap spent cuts m and
// fails with errCapped. Between two TCP sockets — a program's connection
// handed to the daemon, and a destination — the bytes move inside the
// kernel (splice), a chunk at a time while the cap has room for one;
// otherwise, and for the cap's last chunk, through a buffer.
func pipe(dst io.Writer, src io.Reader, m *metered, dir *atomic.Int64) error {
	return pipeN(dst, src, -1, m, dir)
}

// pipeN is pipe of n bytes (all, when n < 0); it fails with
// io.ErrUnexpectedEOF when src ends before n.
func pipeN(dst io.Writer, src io.Reader, n int64, m *metered, dir *atomic.Int64) error {
	left := n
	tdst, ok := dst.(*net.TCPConn)
	tsrc, ok2 := src.(*net.TCPConn)
	if ok && ok2 {
		done, err := splice(tdst, tsrc, &left, m, dir)
		if done || err != nil {
			return err
		}
	}
	r := src
	if left >= 0 {
		r = &io.LimitedReader{R: src, N: left}
	}
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	for {
		k, err := r.Read(buf)
		if k > 0 {
			g := m.p.bytes.take(int64(k))
			if g > 0 {
				w, werr := dst.Write(buf[:g])
				m.p.bytes.give(g - int64(w))
				dir.Add(int64(w))
				if left > 0 {
					left -= int64(w)
				}
				if werr != nil {
					return werr
				}
			}
			if g < int64(k) {
				return m.capped()
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if left > 0 {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// splice moves src to dst in the kernel, a chunk at a time, each held of
// the cap while it moves, until src ends (done), *left reaches 0 (done), or
// the cap has no room for a whole chunk (not done: the rest goes through
// a buffer).
func splice(dst, src *net.TCPConn, left *int64, m *metered, dir *atomic.Int64) (done bool, err error) {
	defer src.SetReadDeadline(time.Time{})
	for *left != 0 {
		chunk := int64(spliceChunk)
		if *left > 0 {
			chunk = min(chunk, *left)
		}
		if !m.p.bytes.hold(chunk) {
			return false, nil
		}
		src.SetReadDeadline(time.Now().Add(spliceHold))
		k, err := dst.ReadFrom(&io.LimitedReader{R: src, N: chunk})
		m.p.bytes.release(chunk, k)
		dir.Add(k)
		if *left > 0 {
			*left -= k
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue // the hold's time is up: take it again
		case err != nil:
			return true, err
		case k < chunk:
			return true, nil // src ended
		}
	}
	return true, nil
}

// metered is a destination connection whose bytes are taken from the
// session's cap and counted each way; the cap spent cuts it.
type metered struct {
	net.Conn
	p        *Proxy
	up, down atomic.Int64
	over     atomic.Bool
}

// capped cuts the connection at the cap and returns errCapped.
func (m *metered) capped() error {
	m.over.Store(true)
	m.Conn.Close()
	return errCapped
}

// Read passes on what it read as far as the cap allows: what is past it
// was received, and is dropped.
func (m *metered) Read(b []byte) (int, error) {
	if m.over.Load() {
		return 0, errCapped
	}
	n, err := m.Conn.Read(b)
	g := int(m.p.bytes.take(int64(n)))
	m.down.Add(int64(g))
	if g < n {
		return g, m.capped()
	}
	return n, err
}

func (m *metered) Write(b []byte) (int, error) {
	if m.over.Load() {
		return 0, errCapped
	}
	g := m.p.bytes.take(int64(len(b)))
	n, err := m.Conn.Write(b[:g])
	m.p.bytes.give(g - int64(n))
	m.up.Add(int64(n))
	if err == nil && int(g) < len(b) {
		err = m.capped()
	}
	return n, err
}

// CloseWrite half-closes the destination connection.
func (m *metered) CloseWrite() error {
	if cw, ok := m.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return m.Conn.Close()
}
