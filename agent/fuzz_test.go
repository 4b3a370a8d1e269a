package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// FuzzReadFrame checks the frame decoder: it never panics, never returns a
// frame over MaxFrame, and what it decodes encodes back to the same bytes.
func FuzzReadFrame(f *testing.F) {
	f.Add(appendFrame(nil, frameReply, 0, 1, []byte(`{"err":{"kind":"NotFound"}}`), nil))
	f.Add(appendFrame(appendFrame(nil, frameData, flagStderr, 7, nil, []byte("out")), frameWindow, 0, 7, nil, []byte{0, 0, 1, 0}))
	f.Add([]byte{0, 0, 0, 10, 4, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 12, 3, 0, 0, 0, 0, 1, 0, 0, 0, 9, 'x', 'y'})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		var again []byte
		consumed := 0
		for {
			fr, err := readFrame(r)
			if err != nil {
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, errFrame) {
					t.Fatalf("unexpected error %v", err)
				}
				break
			}
			if len(fr.header)+len(fr.payload)+frameFixed > MaxFrame {
				t.Fatalf("frame of %d bytes", len(fr.header)+len(fr.payload))
			}
			again = appendFrame(again, fr.typ, fr.flags, fr.id, fr.header, fr.payload)
			consumed = len(again)
		}
		if !bytes.Equal(again, data[:consumed]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzClientAnswer plays an agent that answers one call with arbitrary bytes,
// then closes the stream. Whatever it sends, the call returns — with a result
// that passed the client's checks, or an error — and nothing panics.
func FuzzClientAnswer(f *testing.F) {
	reply := func(op byte, body string) []byte {
		return append([]byte{op}, appendFrame(nil, frameReply, 0, 1, nil, []byte(body))...)
	}
	f.Add(reply(0, `{"n":"x","s":3,"m":420,"t":1}`))
	f.Add(reply(1, `[{"n":"a","y":0,"i":{"n":"a","s":1,"m":420}},{"n":"b","y":2147483648}]`))
	f.Add(reply(2, "file data"))
	f.Add(append([]byte{2}, appendFrame(appendFrame(nil, frameData, 0, 1, []byte(`{"size":6}`), []byte("abc")), frameReply, 0, 1, nil, []byte("def"))...))
	f.Add(reply(3, `{"Entries":[{"Path":"sub/a","Type":0}],"Truncated":true}`))
	f.Add(reply(4, `{"Lines":[{"Path":"sub/a","Line":2,"Text":"x","Match":true}],"Matches":1}`))
	f.Add(append([]byte{5}, appendFrame(appendFrame(nil, frameData, flagStderr, 1, nil, []byte("err")), frameReply, 0, 1, nil, []byte(`{"exitCode":1,"duration":5}`))...))
	f.Add(append([]byte{6}, appendFrame(nil, frameData, 0, 1, nil, nil)...))
	f.Add(append([]byte{0}, appendFrame(nil, frameReply, 0, 1, []byte(`{"err":{"kind":"NotFound","op":"stat","path":"x"}}`), nil)...))
	f.Add([]byte{3, 0, 0, 0, 200, 4, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		op, stream := data[0]%7, data[1:]
		a, b := net.Pipe()
		go func() {
			defer b.Close()
			r := bufio.NewReader(b)
			if _, err := readFrame(r); err != nil {
				return
			}
			h, _ := json.Marshal(hello{Version: ProtocolVersion})
			b.Write(appendFrame(nil, frameHello, 0, 0, h, nil))
			if _, err := readFrame(r); err != nil { // the call
				return
			}
			go io.Copy(io.Discard, r)
			b.Write(stream)
		}()
		c, err := NewClient(a, WithHandshakeTimeout(5*time.Second), WithCancelGrace(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		switch op {
		case 0:
			if fi, err := c.Stat(ctx, "x"); err == nil && fi.Name() != "." && !validBase(fi.Name()) {
				t.Fatalf("Stat name %q", fi.Name())
			}
		case 1:
			entries, err := c.ReadDir(ctx, "d")
			for _, e := range entries {
				if !validBase(e.Name()) || err != nil {
					t.Fatalf("ReadDir entry %q with error %v", e.Name(), err)
				}
			}
		case 2:
			if data, err := c.ReadFile(ctx, "x", 16); err == nil && len(data) > 16 {
				t.Fatalf("ReadFile returned %d bytes", len(data))
			}
		case 3:
			res, err := c.Walk(ctx, workspace.WalkRequest{Dir: "sub", Limit: 5})
			for _, e := range res.Entries {
				if !under(e.Path, "sub") || err != nil {
					t.Fatalf("Walk entry %q", e.Path)
				}
			}
		case 4:
			res, err := c.Grep(ctx, workspace.GrepRequest{Dir: "sub", Pattern: "x"})
			for _, l := range res.Lines {
				if !under(l.Path, "sub") || err != nil {
					t.Fatalf("Grep line in %q", l.Path)
				}
			}
		case 5:
			res, err := c.Run(ctx, workspace.Command{Script: "x", Output: func(workspace.Stream, []byte) {}})
			if err == nil && !validSignal(res.Signal) {
				t.Fatalf("Run result %+v", res)
			}
		case 6:
			if unlock, err := c.Lock(ctx, "x"); err == nil {
				unlock()
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the call hung until its deadline")
		}
		var pe *fs.PathError
		if _, err := c.Stat(context.Background(), "y"); err != nil && !errors.As(err, &pe) {
			t.Fatalf("error %v is no *fs.PathError", err)
		}
	})
}
