package multiprocess

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// childMain serves the parent's requests on stdin/stdout until stdin
// closes. Its logs go to stderr.
func childMain() int {
	rt, err := newRuntime(configFromEnv())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child runtime:", err)
		return 1
	}
	defer rt.Destroy()
	s := &childState{rt: rt}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 256<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "child: bad request:", err)
			return 1
		}
		r := s.handle(req)
		if err := out.Encode(r); err != nil {
			return 1
		}
		if req.Op == "exit" {
			break
		}
	}
	s.releaseAll()
	return 0
}

type childState struct {
	rt    *engine.Runtime
	mu    sync.Mutex
	refs  []*engine.Ref
	freed atomic.Int64
	// releases free what put_exchange put.
	releases []func()
	// prepared writes kept open after their loop
	prepared []*engine.Prepared
}

func fail(err error) reply {
	return reply{Status: int32(transport.StatusOf(err)), Error: err.Error()}
}

func (s *childState) keep(r *engine.Ref) {
	s.mu.Lock()
	s.refs = append(s.refs, r)
	s.mu.Unlock()
}

// keepShared keeps a ref just made (with err) and returns its serialized
// bytes, encoded for a reply.
func (s *childState) keepShared(ref *engine.Ref, err error) (string, error) {
	if err != nil {
		return "", err
	}
	b, err := ref.Serialize()
	if err != nil {
		return "", err
	}
	s.keep(ref)
	return enc(b), nil
}

func (s *childState) releaseAll() {
	s.mu.Lock()
	refs := s.refs
	s.refs = nil
	releases := s.releases
	s.releases = nil
	s.mu.Unlock()
	for _, r := range refs {
		r.Release()
	}
	for _, release := range releases {
		release()
	}
}

func (s *childState) transportCounts() map[string]uint64 {
	used := map[string]uint64{}
	for _, ti := range s.rt.Registry().List() {
		used[ti.Name] = ti.TransfersCompleted
	}
	return used
}

func (s *childState) handle(req request) reply {
	switch req.Op {
	case "hello":
		return reply{Address: s.rt.Address(), Pid: os.Getpid()}
	case "put":
		tensors := make([]transport.Tensor, len(req.Sizes))
		bufs := make([][]byte, len(req.Sizes))
		for i, n := range req.Sizes {
			bufs[i] = hostMem(n)
			for j := range bufs[i] {
				bufs[i][j] = patternByte(req.Seed, i, j)
			}
			tensors[i] = tensorOver(bufs[i])
		}
		var out []string
		for k := 0; k < max(req.Count, 1); k++ {
			last := k == max(req.Count, 1)-1
			release := func() {}
			if last {
				release = func() {
					for _, b := range bufs {
						freeMem(b)
					}
					s.freed.Add(1)
				}
			}
			b, err := s.keepShared(s.rt.Put(tensors, req.Transport, release))
			if err != nil {
				return fail(err)
			}
			out = append(out, b)
		}
		return reply{Refs: out}
	case "deserialize":
		for _, r := range req.Refs {
			ref, err := s.rt.Deserialize(dec(r))
			if err != nil {
				return fail(err)
			}
			s.keep(ref)
		}
		return reply{}
	case "reserialize":
		var out []string
		for _, r := range req.Refs {
			ref, err := s.rt.Deserialize(dec(r))
			if err != nil {
				return fail(err)
			}
			b, err := ref.Serialize()
			ref.Release()
			if err != nil {
				return fail(err)
			}
			out = append(out, enc(b))
		}
		return reply{Refs: out}
	case "get":
		if err := s.get(req); err != nil {
			return fail(err)
		}
		return reply{Used: s.transportCounts()}
	case "release_all":
		s.releaseAll()
		return reply{}
	case "stats":
		st := s.rt.Stats()
		return reply{Stats: &st, Freed: int(s.freed.Load()), Used: s.transportCounts()}
	case "put_exchange":
		refs, release, err := putObjects(s.rt, req.Seed)
		if err != nil {
			return fail(err)
		}
		s.mu.Lock()
		s.releases = append(s.releases, release)
		s.mu.Unlock()
		return reply{Refs: encAll(refs)}
	case "exchange":
		refs := make([][]byte, len(req.Refs))
		for i, r := range req.Refs {
			refs[i] = dec(r)
		}
		res := exchange(s.rt, refs, req.Seed, time.Duration(req.Millis)*time.Millisecond, "child")
		st := s.rt.Stats()
		return reply{Exchange: &res, Stats: &st}
	case "expose":
		tensors := make([]transport.Tensor, len(req.Sizes))
		for i, n := range req.Sizes {
			tensors[i] = tensorOver(hostMem(n))
		}
		b, err := s.keepShared(s.rt.Expose(tensors, req.Transport, nil))
		if err != nil {
			return fail(err)
		}
		return reply{Refs: []string{b}}
	case "write_loop":
		ref, err := s.rt.Deserialize(dec(req.Refs[0]))
		if err != nil {
			return fail(err)
		}
		s.keep(ref)
		go s.writeLoop(ref, req)
		return reply{}
	case "exit":
		return reply{}
	}
	return reply{Status: int32(transport.ErrInvalidArgument), Error: "unknown op " + req.Op}
}

// get deserializes refs and fetches them, all in one fetch or each in its
// own goroutine, verifying the pattern.
func (s *childState) get(req request) error {
	refs := make([]*engine.Ref, len(req.Refs))
	for i, r := range req.Refs {
		ref, err := s.rt.Deserialize(dec(r))
		if err != nil {
			return err
		}
		defer ref.Release()
		refs[i] = ref
	}
	opts := engine.FetchOptions{Transport: req.Override}
	fetchOne := func(group []*engine.Ref) error {
		var targets []transport.Tensor
		var all [][]byte
		for _, r := range group {
			ts, bufs := targetsFor(r.Desc())
			targets = append(targets, ts...)
			all = append(all, bufs...)
		}
		defer func() {
			for _, b := range all {
				freeMem(b)
			}
		}()
		if err := s.rt.Get(group, targets, opts, 60*time.Second); err != nil {
			return err
		}
		off := 0
		for _, r := range group {
			n := len(r.Desc().Tensors)
			if err := checkPattern(all[off:off+n], req.Seed); err != nil {
				return err
			}
			off += n
		}
		return nil
	}
	if !req.Parallel {
		return fetchOne(refs)
	}
	errs := make(chan error, len(refs))
	for _, r := range refs {
		go func() { errs <- fetchOne([]*engine.Ref{r}) }()
	}
	var first error
	for range refs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// writeLoop writes into a writable ref, version after version (tag k holds
// the pattern of seed plus k), req.Count times (0: until the process
// ends).
func (s *childState) writeLoop(ref *engine.Ref, req request) {
	bufs := make([][]byte, len(req.Sizes))
	tensors := make([]transport.Tensor, len(req.Sizes))
	for i, n := range req.Sizes {
		bufs[i] = hostMem(n)
		tensors[i] = tensorOver(bufs[i])
	}
	write := func(tag int) error {
		return s.rt.Write([]*engine.Ref{ref}, tensors, engine.WriteOptions{Tag: uint64(tag)}, -1)
	}
	if req.Prepared {
		pw, err := s.rt.PrepareWrite([]*engine.Ref{ref}, tensors, engine.WriteOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child: prepare write:", err)
			return
		}
		s.mu.Lock()
		s.prepared = append(s.prepared, pw)
		s.mu.Unlock()
		write = func(tag int) error { return pw.Run(uint64(tag), -1) }
	}
	for tag := 1; req.Count == 0 || tag <= req.Count; tag++ {
		for i, b := range bufs {
			for j := range b {
				b[j] = patternByte(req.Seed, i, j) + byte(tag)
			}
		}
		if err := write(tag); err != nil {
			fmt.Fprintln(os.Stderr, "child: write:", err)
			return
		}
	}
}
