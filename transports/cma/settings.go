package cma

import "github.com/rdt-project/rdt/core/transport"

// The environment variables cma reads, through Host.Settings.
var (
	workersSetting = transport.IntSetting{Name: "RDT_CMA_WORKERS", Default: 2, Min: 1, Max: maxWorkers,
		Meaning: "threads one cma fetch copies with"}
	setPtracerSetting = transport.FlagSetting{Name: "RDT_CMA_SET_PTRACER", Default: true,
		Meaning: "under Yama ptrace_scope 1, let same-user processes read this one so that cma works (0: keep the restriction; cma then fails and names shm)"}
)

// Settings are cma's rows of the runtime's table of environment variables.
func Settings() []transport.Setting {
	return []transport.Setting{workersSetting.Setting(), setPtracerSetting.Setting()}
}
