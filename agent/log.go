package agent

import (
	"bytes"
	"fmt"
	"io"
	"sync"
)

// LogSink is w with its failures ignored: a backend copies the agent's log
// (its standard error) there, and that log must never break the agent's
// stream.
func LogSink(w io.Writer) io.Writer { return sink{w} }

type sink struct{ w io.Writer }

func (s sink) Write(p []byte) (int, error) {
	s.w.Write(p)
	return len(p), nil
}

// LogTail keeps the last bytes of an agent's log written to it, for the
// error of an agent that failed to start. It is safe for concurrent use.
type LogTail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// NewLogTail returns a LogTail that keeps the last max bytes.
func NewLogTail(max int) *LogTail { return &LogTail{max: max} }

func (w *LogTail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = w.buf[over:]
	}
	return len(p), nil
}

// String is "" when nothing was written, else the tail as a quoted suffix
// for an error message ("; agent's log: ...").
func (w *LogTail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return ""
	}
	return fmt.Sprintf("; agent's log: %q", bytes.TrimSpace(w.buf))
}
