package transporttest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// A transport that moves bytes only between the ranks of a group (its
// descriptor sets GroupBackend, and it is two-sided) runs the data cases
// in a group of two: the destination is rank 0, the source rank 1, each on
// the device of Config.Ranks. The suite forms the group through the
// transport's GroupBackend, as the engine does, and runs the source's Send
// once the destination's Fetch has started.

// groupName is the name of the suite's groups.
const groupName = "conformance"

// grouped says whether the suite runs the transport in groups.
func (s *suite) grouped() bool { return s.conf.Ranks != nil }

// memOf is where the tensors of rank live.
func (s *suite) memOf(rank int) Memory {
	if s.grouped() {
		return s.conf.Ranks(rank)
	}
	return s.mem
}

// spec is rank's part in the suite's group.
func spec(desc transport.Descriptor, mem Memory, rank int) transport.GroupSpec {
	return transport.GroupSpec{Name: groupName, WorldSize: 2, Rank: rank, Device: int(mem.Device.ID), Backend: desc.Name}
}

// roster makes the group's roster on rank 0.
func roster(t *testing.T, dst *end, rank1 transport.RuntimeID) *transport.GroupRoster {
	t.Helper()
	gb, ok := dst.tr.(transport.GroupBackend)
	if !ok {
		t.Fatal("Config.Ranks is set, but the transport is no GroupBackend")
	}
	boot, err := gb.NewGroupBootstrap(spec(dst.desc, dst.mem, 0))
	if err != nil {
		t.Fatalf("making the group's bootstrap: %v", err)
	}
	var inst [8]byte
	_, _ = rand.Read(inst[:])
	return &transport.GroupRoster{Name: groupName, Backend: dst.desc.Name, Instance: binary.LittleEndian.Uint64(inst[:]), Bootstrap: boot,
		Members: []transport.GroupMember{{Runtime: dst.host.ID, Name: "rank0"}, {Runtime: rank1, Name: "rank1"}}}
}

// groupPair forms the group of dst (rank 0) and src (rank 1), both in this
// process, and lets dst's fetches run src's Send.
func (s *suite) groupPair(t *testing.T, src, dst *end) {
	t.Helper()
	r := roster(t, dst, src.host.ID)
	errs := make(chan error, 1)
	go func() {
		errs <- initRank(src.tr, r, spec(src.desc, src.mem, 1))
	}()
	if err := initRank(dst.tr, r, spec(dst.desc, dst.mem, 0)); err != nil {
		t.Fatalf("forming the group on rank 0: %v", err)
	}
	if err := <-errs; err != nil {
		t.Fatalf("forming the group on rank 1: %v", err)
	}
	// Both ranks leave the group at once (a rank's destroy may wait for
	// its peers').
	t.Cleanup(func() { leave(src.tr, dst.tr) })
	dst.send = func(x *transport.Transfer, cmeta []byte) {
		sx := *x
		sx.Role = transport.RoleSource
		tensors, unpin, err := src.host.PinObject(x.Object)
		if err != nil {
			return // the destination's fetch fails on its own
		}
		go func() {
			defer unpin()
			_ = src.tr.(transport.Sender).Send(&sx, tensors, nil, cmeta)
		}()
	}
}

// groupSource forms the group of dst (rank 0) and a source process (rank
// 1), and lets dst's fetches from it run its Send.
func (s *suite) groupSource(t *testing.T, dst *end, src *Source) {
	t.Helper()
	r := roster(t, dst, src.Peer.RuntimeID)
	fmt.Fprintf(src.in, "GROUP %x %x %x %x\n", r.Instance, r.Bootstrap, r.Members[0].Runtime[:], r.Members[1].Runtime[:])
	if err := initRank(dst.tr, r, spec(dst.desc, dst.mem, 0)); err != nil {
		t.Fatalf("forming the group with the source process: %v", err)
	}
	t.Cleanup(func() { _ = dst.tr.(transport.GroupBackend).DestroyGroup(groupName) })
	dst.send = func(x *transport.Transfer, cmeta []byte) {
		fmt.Fprintf(src.in, "SEND %x %d %x %x %s\n", x.Object[:], x.TransferID, x.Destination.RuntimeID[:], cmeta, formatPieces(x.Pieces))
	}
}

func initRank(tr transport.Transport, r *transport.GroupRoster, sp transport.GroupSpec) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return tr.(transport.GroupBackend).InitGroup(ctx, r, sp)
}

func leave(trs ...transport.Transport) {
	done := make(chan struct{}, len(trs))
	for _, tr := range trs {
		go func() { _ = tr.(transport.GroupBackend).DestroyGroup(groupName); done <- struct{}{} }()
	}
	for range trs {
		<-done
	}
}

// serveGroup runs in a source process of a grouped transport: it joins the
// group its parent forms and runs the Send of each transfer its parent
// starts, until stdin closes.
func serveGroup(conf Config, h *Host, tr transport.Transport, tensors []transport.Tensor, in io.Reader) {
	desc := tr.Describe()
	lines := bufio.NewScanner(in)
	lines.Buffer(make([]byte, 64<<10), 64<<10)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		switch {
		case len(f) == 5 && f[0] == "GROUP":
			inst, err := strconv.ParseUint(f[1], 16, 64)
			boot, err2 := hex.DecodeString(f[2])
			r := &transport.GroupRoster{Name: groupName, Backend: desc.Name, Instance: inst, Bootstrap: boot,
				Members: []transport.GroupMember{{Name: "rank0"}, {Name: "rank1"}}}
			for i := range 2 {
				id, err := hex.DecodeString(f[3+i])
				if err != nil || len(id) != len(r.Members[i].Runtime) {
					err2 = fmt.Errorf("bad runtime id %q", f[3+i])
				}
				copy(r.Members[i].Runtime[:], id)
			}
			if err == nil {
				err = err2
			}
			if err == nil {
				err = initRank(tr, r, spec(desc, conf.Ranks(1), 1))
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "source process: joining the group:", err)
			}
		case len(f) == 6 && f[0] == "SEND":
			x := &transport.Transfer{Transport: desc.Name, Role: transport.RoleSource, Source: h.Identity()}
			obj, err := hex.DecodeString(f[1])
			copy(x.Object[:], obj)
			x.TransferID, _ = strconv.ParseUint(f[2], 10, 64)
			id, _ := hex.DecodeString(f[3])
			copy(x.Destination.RuntimeID[:], id)
			cmeta, err2 := hex.DecodeString(f[4])
			pieces, err3 := parsePieces(f[5])
			x.Pieces = pieces
			if err != nil || err2 != nil || err3 != nil {
				fmt.Fprintln(os.Stderr, "source process: bad SEND line")
				continue
			}
			go func() { _ = tr.(transport.Sender).Send(x, tensors, nil, cmeta) }()
		}
	}
}
