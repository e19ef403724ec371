package engine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// TestHostilePeerChild is the hostile peer process of hostile_test.go; it
// does nothing unless RDT_HOSTILE_MODE is set.
func TestHostilePeerChild(t *testing.T) {
	mode := os.Getenv(hostileModeEnv)
	if mode == "" {
		t.Skip("the hostile peer process of other tests")
	}
	report := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	n, _ := strconv.Atoi(os.Getenv("RDT_HOSTILE_N"))
	unixPath, tcpAddr := os.Getenv("RDT_HOSTILE_UNIX"), os.Getenv("RDT_HOSTILE_TCP")
	switch mode {
	case "preauth":
		length, _ := strconv.Atoi(os.Getenv("RDT_HOSTILE_LEN"))
		bodySize, _ := strconv.Atoi(os.Getenv("RDT_HOSTILE_BODY"))
		prefix := binary.LittleEndian.AppendUint32(nil, uint32(length))
		prefix = append(prefix, byte(control.KindHello))
		body := make([]byte, bodySize)
		var conns []net.Conn
		var wg sync.WaitGroup
		for _, target := range [][2]string{{"unix", unixPath}, {"tcp", tcpAddr}} {
			for i := 0; i < n; i++ {
				c, err := net.Dial(target[0], target[1])
				if err != nil {
					continue
				}
				conns = append(conns, c)
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.SetWriteDeadline(time.Now().Add(20 * time.Second))
					if _, err := c.Write(prefix); err == nil {
						c.Write(body) // a refused one fails: fine
					}
				}()
			}
		}
		wg.Wait()
		report("SENT %d", len(conns))
		io.Copy(io.Discard, os.Stdin)
	case "idle":
		var conns []net.Conn
		for _, target := range [][2]string{{"unix", unixPath}, {"tcp", tcpAddr}} {
			var mine []net.Conn
			for i := 0; i < n; i++ {
				c, err := net.Dial(target[0], target[1])
				if err != nil {
					t.Fatalf("dial %s: %v", target[0], err)
				}
				mine = append(mine, c)
			}
			var mu sync.Mutex
			var wg sync.WaitGroup
			closed, open := 0, 0
			for _, c := range mine {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.SetReadDeadline(time.Now().Add(3 * time.Second))
					_, err := c.Read(make([]byte, 1))
					var ne net.Error
					mu.Lock()
					if errors.As(err, &ne) && ne.Timeout() {
						open++
					} else {
						closed++
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			report("IDLE_%s %d %d", target[0], closed, open)
			conns = append(conns, mine...)
		}
		io.Copy(io.Discard, os.Stdin)
	case "flood":
		c, _ := hostileConnect(t, unixPath)
		pings, _ := strconv.Atoi(os.Getenv("RDT_HOSTILE_PINGS"))
		ping := (&control.Message{Kind: control.KindPing}).Encode()
		batch := make([]byte, 0, 10000*len(ping))
		sent := 0
		for sent < pings {
			batch = batch[:0]
			for i := 0; i < 10000 && sent+i < pings; i++ {
				batch = append(batch, ping...)
			}
			if _, err := c.Write(batch); err != nil {
				t.Fatalf("after %d pings: %v", sent, err)
			}
			sent += len(batch) / len(ping)
		}
		report("PINGS %d", sent)
		requests, _ := strconv.Atoi(os.Getenv("RDT_HOSTILE_REQUESTS"))
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		written := 0
		for i := 1; i <= requests; i++ {
			m := &control.Message{Kind: control.KindMetadata, ID: uint64(i), Object: transport.RandomID(), Transport: "shm"}
			if _, err := c.Write(m.Encode()); err != nil {
				break // the runtime stopped reading: it is busy with what we sent
			}
			written++
		}
		report("REQUESTS %d", written)
		io.Copy(io.Discard, os.Stdin)
	case "leases":
		// RDT_HOSTILE_IDS identities (1 unless set), one connection each,
		// each asking for n leases.
		ids, _ := strconv.Atoi(os.Getenv("RDT_HOSTILE_IDS"))
		obj, err := transport.ParseID(os.Getenv("RDT_HOSTILE_OBJECT"))
		if err != nil {
			t.Fatal(err)
		}
		type held struct {
			c      net.Conn
			rd     *bufio.Reader
			tokens []uint64
		}
		var all []*held
		granted, refused, other, why := 0, 0, 0, ""
		for range max(ids, 1) {
			c, rd := hostileConnect(t, unixPath)
			h := &held{c: c, rd: rd}
			all = append(all, h)
			// As many requests in flight as a peer may have (a peer past
			// its window is closed, rightly): the flood is of leases, not
			// of unanswered requests.
			window := make(chan struct{}, control.MaxUnanswered)
			go func() {
				for i := 1; i <= n; i++ {
					window <- struct{}{}
					if _, err := c.Write((&control.Message{Kind: control.KindLease, ID: uint64(i), Object: obj}).Encode()); err != nil {
						return
					}
				}
			}()
			for i := 0; i < n; i++ {
				m := hostileResponse(t, rd)
				<-window
				switch m.Status {
				case transport.OK:
					granted++
					h.tokens = append(h.tokens, m.Token)
				case transport.ErrNoMemory:
					refused++
					why = m.Text
				default:
					other++
					why = m.Text
				}
			}
		}
		report("LEASES %d %d %d %s", granted, refused, other, why)
		// Asked to, deserialize what we hold: a borrow with each token,
		// then return the borrows.
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return
		}
		consumed := 0
		for _, h := range all {
			go func() {
				w := bufio.NewWriter(h.c)
				for i, token := range h.tokens {
					w.Write((&control.Message{Kind: control.KindBorrow, ID: uint64(n + 1 + i), Object: obj, Token: token}).Encode())
				}
				w.Flush()
			}()
			for range h.tokens {
				if m := hostileResponse(t, h.rd); m.Status != transport.OK {
					t.Fatalf("borrow refused: %s", m.Text)
				}
			}
			h.c.Write((&control.Message{Kind: control.KindUnborrow, Object: obj, Count: uint64(len(h.tokens))}).Encode())
			consumed += len(h.tokens)
		}
		report("CONSUMED %d", consumed)
		io.Copy(io.Discard, os.Stdin)
	case "crossuid":
		report("UID %d", os.Getuid())
		owner, err := transport.ParseID(os.Getenv("RDT_HOSTILE_OWNER"))
		if err != nil {
			t.Fatal(err)
		}
		obj, err := transport.ParseID(os.Getenv("RDT_HOSTILE_OBJECT"))
		if err != nil {
			t.Fatal(err)
		}
		// What another user can learn is the port; it makes up the rest.
		td, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 2, Bits: 32, Lanes: 1}, []int64{1024})
		if err != nil {
			t.Fatal(err)
		}
		desc := newObjectDesc(obj, OwnerInfo{RuntimeID: owner, Address: control.TCPScheme + tcpAddr}, "", []transport.TensorDesc{td}, nil)
		rt, err := NewRuntime(Options{Name: "other-user", LogLevel: transport.LogOff, Network: control.Sockets{}, SocketDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Destroy()
		_, err = rt.Deserialize(EncodeRef(desc, nil, 0))
		report("BORROW %s %v", transport.StatusOf(err), err)
		c, err := net.Dial("tcp", tcpAddr)
		if err != nil {
			t.Fatal(err)
		}
		rd, err := rawHandshake(c, newRawPeer(), "")
		if err == nil {
			c.Write((&control.Message{Kind: control.KindMetadata, ID: 1, Object: obj, Transport: "mem"}).Encode())
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if m := hostileResponse(t, rd); m.Status != transport.OK {
				err = &transport.Error{Status: m.Status, Msg: m.Text}
			}
		}
		report("METADATA %s %v", transport.StatusOf(err), err)
		// A write into the object, even with its key, needs a connection.
		c2, err := net.Dial("tcp", tcpAddr)
		if err != nil {
			t.Fatal(err)
		}
		rd2, err := rawHandshake(c2, newRawPeer(), "")
		if err == nil {
			c2.Write((&control.Message{Kind: control.KindWriteOpen, ID: 2, Object: obj, Transport: "mem"}).Encode())
			c2.SetReadDeadline(time.Now().Add(10 * time.Second))
			if m := hostileResponse(t, rd2); m.Status != transport.OK {
				err = &transport.Error{Status: m.Status, Msg: m.Text}
			}
		}
		report("WRITE %s %v", transport.StatusOf(err), err)
		io.Copy(io.Discard, os.Stdin)
	default:
		t.Fatalf("unknown mode %q", mode)
	}
}

// hostileConnect is a real peer's handshake over the Unix socket, with its
// own key and its true pid and host.
func hostileConnect(t *testing.T, path string) (net.Conn, *bufio.Reader) {
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := newRawPeer()
	p.info.HostID = hostIdentity()
	rd, err := rawHandshake(c, p, "")
	if err != nil {
		t.Fatal(err)
	}
	return c, rd
}

// hostileResponse reads up to the next response, past the runtime's pings.
func hostileResponse(t *testing.T, rd *bufio.Reader) *control.Message {
	for {
		b, err := control.ReadFrame(rd, nil, control.MaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		m, err := control.DecodeMessage(b)
		if err != nil {
			t.Fatal(err)
		}
		if m.Kind == control.KindResponse {
			return m
		}
	}
}
