package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"github.com/rdt-project/rdt/core/transport"
)

// Variable is one environment variable rdt reads. Variables is the one
// table of them (docs/configuration.md prints it); nothing else in the Go
// tree reads the environment, except the library loaders named in Where.
type Variable struct {
	Name    string
	Type    string
	Default string
	Meaning string
	Bounds  string
	// Where is "runtime" for variables read and checked each time a
	// runtime is created, or the loader that reads it once per process
	// (library paths, and UCX's own variables, which must be read from the
	// C environment that the libraries themselves read).
	Where string
	// apply checks a set, non-empty value (or any set value, with
	// keepEmpty) and stores it; its error says what is wanted, and
	// ReadEnvironment names the variable. nil for variables read by a
	// loader.
	apply     func(value string, env *Environment) error
	keepEmpty bool
}

// Environment is what the variables said when a runtime was created.
type Environment struct {
	Listen     string             // RDT_LISTEN ("": unset)
	AuthToken  string             // RDT_AUTH_TOKEN ("": unset)
	LogLevel   transport.LogLevel // RDT_LOG (LogWarn when unset)
	RuntimeDir string             // XDG_RUNTIME_DIR ("": unset)
	Settings   transport.Settings // the transports' tunables
}

// Variables is the table of every environment variable rdt reads.
var Variables = []Variable{
	{Name: "RDT_LOG", Type: "level", Default: "warn", Where: "runtime",
		Meaning: "log level of runtimes created with RDT_LOG_DEFAULT (lines go to stderr)",
		Bounds:  "off, error, warn, info or debug (also none/0, warning, trace)",
		apply: func(v string, env *Environment) error {
			l, ok := transport.ParseLogLevel(v)
			if !ok {
				return errors.New("want off, error, warn, info or debug")
			}
			env.LogLevel = l
			return nil
		}},
	{Name: "RDT_LISTEN", Type: "host:port", Default: "unset (Unix socket only)", Where: "runtime",
		Meaning: "listen_tcp of runtimes created through the C API with listen_tcp NULL",
		Bounds:  "an address the control plane can listen on",
		apply:   func(v string, env *Environment) error { env.Listen = v; return nil }},
	{Name: "RDT_AUTH_TOKEN", Type: "string", Default: "unset (TCP binds loopback only)", Where: "runtime",
		Meaning: "auth_token of runtimes created through the C API with auth_token NULL",
		Bounds:  "any",
		apply:   func(v string, env *Environment) error { env.AuthToken = v; return nil }},
	{Name: "XDG_RUNTIME_DIR", Type: "path", Default: "unset (<tmp>/rdt-<uid>)", Where: "runtime",
		Meaning: "parent of the default socket_dir ($XDG_RUNTIME_DIR/rdt)",
		Bounds:  "an absolute path",
		apply: func(v string, env *Environment) error {
			if !filepath.IsAbs(v) {
				return errors.New("want an absolute path")
			}
			env.RuntimeDir = v
			return nil
		}},
	{Name: "RDT_TCP_STREAMS", Type: "integer", Default: strconv.Itoa(transport.DefaultTCPStreams), Where: "runtime",
		Meaning: "connections one large tcp fetch is split over",
		Bounds:  "1 to " + strconv.Itoa(transport.MaxTCPStreams),
		apply: func(v string, env *Environment) (err error) {
			env.Settings.TCPStreams, err = intIn(v, 1, transport.MaxTCPStreams)
			return err
		}},
	{Name: "RDT_CMA_WORKERS", Type: "integer", Default: strconv.Itoa(transport.DefaultCMAWorkers), Where: "runtime",
		Meaning: "threads one cma fetch copies with",
		Bounds:  "1 to " + strconv.Itoa(transport.MaxCMAWorkers),
		apply: func(v string, env *Environment) (err error) {
			env.Settings.CMAWorkers, err = intIn(v, 1, transport.MaxCMAWorkers)
			return err
		}},
	{Name: "RDT_CMA_SET_PTRACER", Type: "0 or 1", Default: "1", Where: "runtime",
		Meaning: "under Yama ptrace_scope 1, let same-user processes read this one so that cma works (0: keep the restriction; cma then fails and names shm)",
		Bounds:  "0 or 1",
		apply: func(v string, env *Environment) error {
			switch v {
			case "0":
				env.Settings.CMASetPtracer = false
			case "1":
				env.Settings.CMASetPtracer = true
			default:
				return errors.New("want 0 or 1")
			}
			return nil
		}},
	{Name: "RDT_SHM_ARENA_MIB", Type: "integer", Default: strconv.Itoa(transport.DefaultSHMArenaMiB), Where: "runtime",
		Meaning: "MiB of the long-lived segment shm stages objects of up to 4 MiB in, which a receiver maps once and reads without asking the owner (0: every object gets a segment of its own); memory is taken as objects are staged",
		Bounds:  "0 to " + strconv.Itoa(transport.MaxSHMArenaMiB),
		apply: func(v string, env *Environment) (err error) {
			env.Settings.SHMArenaMiB, err = intIn(v, 0, transport.MaxSHMArenaMiB)
			return err
		}},
	{Name: "RDT_CUDA_IPC_CACHE", Type: "integer", Default: strconv.Itoa(transport.DefaultCUDAIPCCache), Where: "runtime (the first runtime with cuda_ipc sizes the process's cache)",
		Meaning: "opened CUDA IPC handles cuda_ipc keeps per process",
		Bounds:  "0 to " + strconv.Itoa(transport.MaxCUDAIPCCache),
		apply: func(v string, env *Environment) (err error) {
			env.Settings.CUDAIPCCache, err = intIn(v, 0, transport.MaxCUDAIPCCache)
			return err
		}},
	{Name: "CUDA_VISIBLE_DEVICES", Type: "device list", Default: "unset (every device)", Where: "runtime",
		Meaning: "the CUDA driver's device mask; rdt only quotes it in errors about device ordinals",
		Bounds:  "the driver's syntax (not checked by rdt)", keepEmpty: true,
		apply: func(v string, env *Environment) error {
			env.Settings.CUDAVisibleDevices, env.Settings.CUDAVisibleDevicesSet = v, true
			return nil
		}},
	{Name: "RDT_CUDA_LIBRARY", Type: "path", Default: "libcuda.so.1", Where: "the CUDA driver loader, once per process",
		Meaning: "the CUDA driver library cuda_ipc, nixl and nccl open", Bounds: "a loadable library"},
	{Name: "RDT_NCCL_LIBRARY", Type: "path", Default: "libnccl.so.2", Where: "the NCCL loader, once per process",
		Meaning: "the NCCL library the nccl transport and groups open", Bounds: "a loadable library"},
	{Name: "RDT_NIXL_LIBRARY", Type: "path", Default: "libnixl_capi.so", Where: "the NIXL loader, once per process (C environment)",
		Meaning: "NIXL's C API library the nixl transport opens", Bounds: "a loadable library"},
	{Name: "UCX_HANDLE_ERRORS", Type: "UCX's", Default: "set to none by rdt when unset", Where: "the NIXL loader, once per process (C environment)",
		Meaning: "UCX's fault handlers; rdt turns them off unless set, since they break the Go runtime", Bounds: "UCX's"},
	{Name: "UCX_TLS", Type: "UCX's", Default: "unset", Where: "the nixl transport, at each runtime creation (C environment)",
		Meaning: "UCX's transports; rdt warns when the list lacks shared memory", Bounds: "UCX's"},
}

// ReadEnvironment reads and checks every runtime variable of the table
// through lookup (os.LookupEnv in a runtime). An empty value counts as
// unset; any other value out of bounds is an ErrInvalidArgument error that
// names the variable and the value.
func ReadEnvironment(lookup func(name string) (string, bool)) (Environment, error) {
	env := Environment{LogLevel: transport.LogWarn, Settings: transport.DefaultSettings()}
	for _, v := range Variables {
		value, set := lookup(v.Name)
		if v.apply == nil || !set || (value == "" && !v.keepEmpty) {
			continue
		}
		if err := v.apply(value, &env); err != nil {
			return Environment{}, transport.Errorf(transport.ErrInvalidArgument,
				"environment variable %s=%q: %v", v.Name, value, err)
		}
	}
	return env, nil
}

func readProcessEnvironment() (Environment, error) { return ReadEnvironment(os.LookupEnv) }

func intIn(value string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(value)
	if err != nil || n < lo || n > hi {
		return 0, errors.New("want an integer from " + strconv.Itoa(lo) + " to " + strconv.Itoa(hi))
	}
	return n, nil
}
