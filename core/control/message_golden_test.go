package control

import (
	"bufio"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// The control plane's wire format is pinned byte for byte in
// testdata/messages.golden: a frame of every kind (and of each optional
// part of one), what it decodes to, and what DecodeMessage says of bodies
// that break each of its checks. A change to any of them is a protocol
// change and needs a new controlVersion; -update rewrites the file after
// one.
var updateGolden = flag.Bool("update", false, "rewrite testdata/messages.golden from the codec as it is")

const goldenPath = "testdata/messages.golden"

// filled is n bytes counting up from first, so that every field of a
// frame is told apart from its neighbours.
func filled(first byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = first + byte(i)
	}
	return b
}

var goldenPeer = transport.PeerInfo{RuntimeID: transport.ID(filled(0x10, 16)), Name: "trainer-0", Address: "tcp://10.0.0.1:4567?key=k", HostID: "host-a", Pid: 4242,
	Transports: []transport.TransportAdvert{
		{Name: "cuda_ipc", Devices: []transport.DeviceType{transport.DeviceCUDA, transport.DeviceCUDAHost}},
		{Name: "cma", OneSided: true},
	}}

type wireCase struct {
	name string
	m    *Message
}

// wireCases holds a message of every kind, with every field it carries
// set, and a second one of each kind whose encoding has an optional part.
func wireCases() []wireCase {
	obj := goldenObject
	pieces := []transport.Piece{{Tensor: 1, Offset: 0x0102, Length: 0x0304}, {Tensor: 7, Offset: 1 << 40, Length: 1 << 33}}
	return []wireCase{
		{"hello", &Message{Kind: KindHello, Nonce: filled(0xa0, NonceSize)}},
		{"challenge", &Message{Kind: KindChallenge, Nonce: filled(0xa0, NonceSize), Proof: filled(0xc0, ProofSize),
			Key: filled(0xe0, ed25519.PublicKeySize), Sig: filled(0x20, ed25519.SignatureSize)}},
		{"auth", &Message{Kind: KindAuth, Proof: filled(0xc0, ProofSize), Key: filled(0xe0, ed25519.PublicKeySize),
			Sig: filled(0x20, ed25519.SignatureSize), Peer: goldenPeer}},
		{"welcome", &Message{Kind: KindWelcome, Peer: goldenPeer}},
		{"refused", &Message{Kind: KindRefused, Status: transport.ErrPermissionDenied, Text: "wrong token"}},
		{"refused, text cut to its bound", &Message{Kind: KindRefused, Status: transport.ErrNoMemory, Text: strings.Repeat("ab", maxRefusalText)}},
		{"response", &Message{Kind: KindResponse, ID: 0x0102030405060708, Status: transport.ErrNotFound, Text: "gone", Token: 99, Data: []byte("payload")}},
		{"response with a peer", &Message{Kind: KindResponse, ID: 3, Peer: goldenPeer}},
		{"identity", &Message{Kind: KindIdentity, ID: 4}},
		{"borrow", &Message{Kind: KindBorrow, ID: 5, Object: obj, Token: 0xfeed}},
		{"unborrow", &Message{Kind: KindUnborrow, Object: obj, Count: 3}},
		{"lease", &Message{Kind: KindLease, ID: 6, Object: obj}},
		{"metadata", &Message{Kind: KindMetadata, ID: 7, Object: obj, Transport: "shm"}},
		{"send, whole", &Message{Kind: KindSend, ID: 8, Object: obj, TransferID: 0x1234, Transport: "nccl", Data: []byte("cmeta")}},
		{"send, pieces", &Message{Kind: KindSend, ID: 9, Object: obj, TransferID: 0x1235, Transport: "tcp", Pieces: pieces}},
		{"send, no pieces", &Message{Kind: KindSend, ID: 10, Object: obj, TransferID: 0x1236, Transport: "tcp", Pieces: []transport.Piece{}}},
		{"cancel", &Message{Kind: KindCancel, Target: 9}},
		{"ping", &Message{Kind: KindPing, Count: 1 << 40}},
		{"pong", &Message{Kind: KindPong, Count: 77}},
		{"group join", &Message{Kind: KindGroupJoin, ID: 11, Group: GroupJoin{Name: "workers:0", Backend: "nccl", WorldSize: 4, Rank: 3}}},
		{"closing", &Message{Kind: KindClosing}},
		{"write open, whole", &Message{Kind: KindWriteOpen, ID: 12, Object: obj, TransferID: 13, Transport: "cma",
			WriteKey: [16]byte(filled(0x70, 16)), Token: 14, Flags: WriteStanding}},
		{"write open, pieces", &Message{Kind: KindWriteOpen, ID: 15, Object: obj, TransferID: 16, Transport: "mem",
			WriteKey: [16]byte(filled(0x80, 16)), Token: 17, Pieces: pieces}},
		{"write done", &Message{Kind: KindWriteDone, Object: obj, TransferID: 13, Status: transport.ErrAborted, Text: "stopped", Token: 18, Flags: WriteKeep}},
		{"write done, close", &Message{Kind: KindWriteDone, Object: obj, TransferID: 13, Token: 19, Flags: WriteClose}},
		{"write withdrawn", &Message{Kind: KindWriteWithdrawn, Object: obj, TransferID: 13, Status: transport.ErrPermissionDenied, Text: "revoked"}},
		{"write run", &Message{Kind: KindWriteRun, Object: obj, TransferID: 13, Token: 20}},
	}
}

// body is a frame body (no length) of the given kind and id whose fields
// fields writes: a frame no Message encodes to.
func body(kind Kind, id uint64, fields func(w *transport.WireWriter)) []byte {
	w := transport.NewWireWriter(nil)
	w.U8(uint8(kind))
	w.U64(id)
	if fields != nil {
		fields(w)
	}
	return w.Bytes()
}

// peerInfoWith is the golden peer's encoding with the writes of one of its
// parts replaced: part names which (name, address, host, count, advert,
// pid), and write writes it instead.
func peerInfoWith(w *transport.WireWriter, part string, write func(w *transport.WireWriter)) {
	p := goldenPeer
	do := func(name string, def func()) {
		if name == part {
			write(w)
		} else {
			def()
		}
	}
	do("id", func() { w.Raw(p.RuntimeID[:]) })
	do("name", func() { w.Str16(p.Name) })
	do("address", func() { w.Str16(p.Address) })
	do("host", func() { w.Str16(p.HostID) })
	w.U32(uint32(p.Pid))
	do("adverts", func() {
		w.U32(1)
		w.Str8("cma")
		w.U8(1)
		w.U8(1)
		w.I32(int32(transport.DeviceCPU))
	})
}

func welcomeWith(part string, write func(w *transport.WireWriter)) []byte {
	return body(KindWelcome, 0, func(w *transport.WireWriter) { peerInfoWith(w, part, write) })
}

type rejectCase struct {
	name string
	body []byte
}

var goldenObject = transport.ID(filled(0x50, 16))

// rejectCases holds bodies that break DecodeMessage's checks one at a
// time; each valid case cut short by a byte and grown by one comes too.
func rejectCases() []rejectCase {
	return slices.Concat(rejectHandshakes(), rejectAnswersAndRequests(), rejectWrites(), rejectGroupJoins(), rejectChangedFrames())
}

// advert writes an advert count of 1 and an advert.
func advert(name string, oneSided uint8, devs int) func(w *transport.WireWriter) {
	return func(w *transport.WireWriter) {
		w.U32(1)
		w.Str8(name)
		w.U8(oneSided)
		w.U8(uint8(devs))
		for range devs {
			w.I32(1)
		}
	}
}

func hello(magic string, version uint16) []byte {
	return body(KindHello, 0, func(w *transport.WireWriter) {
		w.Raw([]byte(magic))
		w.U16(version)
		w.Raw(filled(0, NonceSize))
	})
}

func rejectHandshakes() []rejectCase {
	return []rejectCase{
		{"empty", nil},
		{"header cut short", body(KindPing, 0, nil)[:8]},
		{"kind 0", body(0, 0, nil)},
		{"kind past the last", body(KindEnd, 0, nil)},
		{"kind 255", body(255, 0, nil)},
		{"hello, bad magic", hello("RDTX", controlVersion)},
		{"hello, other version", hello(controlMagic, controlVersion+1)},
		{"peer, zero runtime id", welcomeWith("id", func(w *transport.WireWriter) { w.Raw(make([]byte, 16)) })},
		{"peer, name too long", welcomeWith("name", func(w *transport.WireWriter) { w.U16(MaxNameLen + 1) })},
		{"peer, address too long", welcomeWith("address", func(w *transport.WireWriter) { w.U16(MaxAddressLen + 1) })},
		{"peer, host id too long", welcomeWith("host", func(w *transport.WireWriter) { w.U16(MaxHostIDLen + 1) })},
		{"peer, too many adverts", welcomeWith("adverts", func(w *transport.WireWriter) { w.U32(maxAdverts + 1) })},
		{"peer, more adverts than bytes", welcomeWith("adverts", func(w *transport.WireWriter) { w.U32(2); w.Raw(make([]byte, 5)) })},
		{"peer, advert name too long", welcomeWith("adverts", advert(strings.Repeat("a", 64), 0, 0))},
		{"peer, advert name not canonical", welcomeWith("adverts", advert("CMA", 0, 0))},
		{"peer, advert name unknown", welcomeWith("adverts", advert("no such", 0, 0))},
		{"peer, bad one-sided flag", welcomeWith("adverts", advert("cma", 2, 0))},
		{"peer, too many devices", welcomeWith("adverts", advert("cma", 0, maxAdvertDevs+1))},
	}
}

// transfer writes the object and transfer id the send and write bodies
// begin with, then what rest writes.
func transfer(kind Kind, id uint64, rest func(w *transport.WireWriter)) []byte {
	return body(kind, id, func(w *transport.WireWriter) {
		w.Raw(goldenObject[:])
		w.U64(2)
		rest(w)
	})
}

func sendWith(pieces func(w *transport.WireWriter)) []byte {
	return transfer(KindSend, 1, func(w *transport.WireWriter) {
		w.Str8("tcp")
		w.Bytes32(nil)
		pieces(w)
	})
}

func metadataFor(name string) []byte {
	return body(KindMetadata, 1, func(w *transport.WireWriter) { w.Raw(goldenObject[:]); w.Str8(name) })
}

func rejectAnswersAndRequests() []rejectCase {
	return []rejectCase{
		{"refused, text too long", body(KindRefused, 0, func(w *transport.WireWriter) { w.I32(-1); w.U32(maxRefusalText + 1) })},
		{"response, text too long", body(KindResponse, 1, func(w *transport.WireWriter) { w.I32(0); w.U32(maxMessageText + 1) })},
		{"response, payload too long", body(KindResponse, 1, func(w *transport.WireWriter) {
			w.I32(0)
			w.Bytes32(nil)
			w.U64(0)
			w.U32(MaxMetadataBytes + 1)
		})},
		{"response, bad identity flag", body(KindResponse, 1, func(w *transport.WireWriter) {
			w.I32(0)
			w.Bytes32(nil)
			w.U64(0)
			w.Bytes32(nil)
			w.U8(2)
		})},
		{"metadata, transport too long", metadataFor(strings.Repeat("a", 64))},
		{"metadata, transport not canonical", metadataFor("SHM")},
		{"metadata, transport unknown", metadataFor("no such")},
		{"send, metadata too long", transfer(KindSend, 1, func(w *transport.WireWriter) { w.Str8("tcp"); w.U32(MaxMetadataBytes + 1) })},
		{"send, too many pieces", sendWith(func(w *transport.WireWriter) { w.U32(transport.MaxTensors + 1) })},
		{"send, more pieces than bytes", sendWith(func(w *transport.WireWriter) { w.U32(2); w.Raw(make([]byte, pieceSize+1)) })},
		{"send, a piece cut short", sendWith(func(w *transport.WireWriter) { w.U32(1); w.Raw(make([]byte, pieceSize-1)) })},
	}
}

func writeOpen(name string, flags uint8) []byte {
	return transfer(KindWriteOpen, 1, func(w *transport.WireWriter) {
		w.Str8(name)
		w.Raw(make([]byte, 16))
		w.U64(3)
		w.U8(flags)
	})
}

func writeDone(flags uint8) []byte {
	return transfer(KindWriteDone, 0, func(w *transport.WireWriter) {
		w.I32(0)
		w.Bytes32(nil)
		w.U64(3)
		w.U8(flags)
	})
}

func rejectWrites() []rejectCase {
	longText := func(w *transport.WireWriter) { w.I32(-1); w.U32(maxMessageText + 1) }
	return []rejectCase{
		{"write open, keep flag", writeOpen("cma", WriteKeep)},
		{"write open, unknown flag", writeOpen("cma", 1<<7)},
		{"write open, transport not canonical", writeOpen("Cma", 0)},
		{"write done, keep and close", writeDone(WriteKeep | WriteClose)},
		{"write done, standing flag", writeDone(WriteStanding)},
		{"write done, text too long", transfer(KindWriteDone, 0, longText)},
		{"write withdrawn, text too long", transfer(KindWriteWithdrawn, 0, longText)},
	}
}

func groupJoin(name, backend string, size, rank int) []byte {
	return body(KindGroupJoin, 1, func(w *transport.WireWriter) {
		w.Str8(name)
		w.Str8(backend)
		w.U32(uint32(size))
		w.U32(uint32(rank))
	})
}

func rejectGroupJoins() []rejectCase {
	return []rejectCase{
		{"group join, name too long", body(KindGroupJoin, 1, func(w *transport.WireWriter) { w.Str8(strings.Repeat("g", 128)) })},
		{"group join, backend too long", body(KindGroupJoin, 1, func(w *transport.WireWriter) { w.Str8("g"); w.Str8(strings.Repeat("b", 64)) })},
		{"group join, bad name", groupJoin("", "nccl", 2, 0)},
		{"group join, backend not canonical", groupJoin("g", "NCCL", 2, 0)},
		{"group join, no ranks", groupJoin("g", "nccl", 0, 0)},
		{"group join, too many ranks", groupJoin("g", "nccl", transport.MaxGroupSize+1, 0)},
		{"group join, rank past the size", groupJoin("g", "nccl", 2, 2)},
		{"group join, negative rank", groupJoin("g", "nccl", 2, -1)},
	}
}

// rejectChangedFrames is every request of wireCases without its id, and
// every frame of wireCases cut short by a byte and grown by one.
func rejectChangedFrames() []rejectCase {
	var cases []rejectCase
	for _, c := range wireCases() {
		if c.m.ID != 0 && c.m.Kind != KindResponse {
			m := *c.m
			m.ID = 0
			cases = append(cases, rejectCase{c.name + ", no id", m.Encode()[4:]})
		}
	}
	for _, c := range wireCases() {
		b := c.m.Encode()[4:]
		cases = append(cases, rejectCase{c.name + ", cut short", b[:len(b)-1]},
			rejectCase{c.name + ", a byte more", append(b, 0)})
	}
	return cases
}

// goldenLines renders every case as the golden file holds it.
func goldenLines(t *testing.T) []string {
	lines := []string{"# The control plane's wire format; see message_golden_test.go."}
	for _, c := range wireCases() {
		frame := c.m.Encode()
		m, err := DecodeMessage(frame[4:])
		require.NoError(t, err, c.name)
		decoded, err := json.Marshal(m)
		require.NoError(t, err)
		lines = append(lines, "frame "+c.name, "  hex "+hex.EncodeToString(frame), "  decoded "+string(decoded))
	}
	for _, c := range rejectCases() {
		result := "accepted"
		if _, err := DecodeMessage(c.body); err != nil {
			result = fmt.Sprintf("%v: %v", transport.StatusOf(err), err)
		}
		lines = append(lines, "reject "+c.name, "  hex "+hex.EncodeToString(c.body), "  error "+result)
	}
	return lines
}

func TestWireFormatIsPinned(t *testing.T) {
	got := goldenLines(t)
	if *updateGolden {
		require.NoError(t, os.WriteFile(goldenPath, []byte(strings.Join(got, "\n")+"\n"), 0o644))
		return
	}
	f, err := os.Open(goldenPath)
	require.NoError(t, err)
	defer f.Close()
	var want []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	require.NoError(t, sc.Err())
	entry := ""
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if !strings.HasPrefix(w, " ") {
			entry = w
		}
		assert.Equal(t, w, g, "line %d of %s, in %q", i+1, goldenPath, entry)
	}
}

// A golden frame decodes and encodes back to the same bytes, and every
// kind has one.
func TestGoldenFramesRoundTrip(t *testing.T) {
	seen := map[Kind]bool{}
	for _, c := range wireCases() {
		frame := c.m.Encode()
		m, err := DecodeMessage(frame[4:])
		require.NoError(t, err, c.name)
		assert.Equal(t, frame, m.Encode(), c.name)
		seen[c.m.Kind] = true
	}
	for k := Kind(1); k < KindEnd; k++ {
		assert.True(t, seen[k], "no golden frame of kind %d (%s)", k, k)
	}
}
