package docker

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/agent"
)

// attachStream is the agent's stream over an attach connection: writes go
// to PID 1's standard input, reads come from its standard output, and its
// standard error goes to the demultiplexer's sink.
type attachStream struct {
	demux
	conn net.Conn
}

func (s *attachStream) Write(p []byte) (int, error) { return s.conn.Write(p) }

// Close ends PID 1's input (the agent's signal to end the session) and closes
// the connection.
func (s *attachStream) Close() error {
	if cw, ok := s.conn.(client.CloseWriter); ok {
		cw.CloseWrite()
	}
	return s.conn.Close()
}

// Stream kinds in the engine's multiplexed (non-TTY) attach protocol: each
// frame is an 8-byte header — kind, three zero bytes, big-endian length —
// and then the payload.
const (
	streamStdin  = 0
	streamStdout = 1
	streamStderr = 2
	streamSystem = 3
)

// maxStderrFrame bounds one stderr or system frame; a larger one is treated
// as a corrupt stream.
const maxStderrFrame = 1 << 20

// demux reads the stdout frames of a multiplexed attach stream as one byte
// stream, copying stderr frames to stderr as it meets them. It is what
// stdcopy.StdCopy does, as a Reader, with no goroutine and no extra copy
// of stdout.
type demux struct {
	r      *bufio.Reader
	stderr io.Writer
	left   int // bytes of the current stdout frame still unread
	hdr    [8]byte
}

func (d *demux) Read(p []byte) (int, error) {
	for d.left == 0 {
		if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
			if err == io.ErrUnexpectedEOF {
				err = fmt.Errorf("attach stream: truncated frame header")
			}
			return 0, err
		}
		n := int(binary.BigEndian.Uint32(d.hdr[4:]))
		switch d.hdr[0] {
		case streamStdout:
			d.left = n
		case streamStderr, streamStdin:
			if n > maxStderrFrame {
				return 0, fmt.Errorf("attach stream: %d-byte stderr frame", n)
			}
			if _, err := io.CopyN(agent.LogSink(d.stderr), d.r, int64(n)); err != nil {
				return 0, fmt.Errorf("attach stream: %w", err)
			}
		case streamSystem:
			msg := make([]byte, min(n, maxStderrFrame))
			io.ReadFull(d.r, msg)
			return 0, fmt.Errorf("attach stream: engine error: %s", msg)
		default:
			return 0, fmt.Errorf("attach stream: unknown stream kind %d", d.hdr[0])
		}
	}
	if len(p) > d.left {
		p = p[:d.left]
	}
	n, err := d.r.Read(p)
	d.left -= n
	if err == io.EOF && d.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
