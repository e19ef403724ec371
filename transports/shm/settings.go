package shm

import "github.com/rdt-project/rdt/core/transport"

// maxArenaMiB bounds RDT_SHM_ARENA_MIB, and what a receiver maps of a
// source's word.
const maxArenaMiB = 4096

// arenaSetting is the environment variable shm reads, through
// Host.Settings.
var arenaSetting = transport.IntSetting{Name: "RDT_SHM_ARENA_MIB", Default: 64, Min: 0, Max: maxArenaMiB,
	Meaning: "MiB of the long-lived segment shm stages objects of up to 4 MiB in, which a receiver maps once and reads without asking the owner (0: every object gets a segment of its own); memory is taken as objects are staged"}

// Settings are shm's rows of the runtime's table of environment variables.
func Settings() []transport.Setting { return []transport.Setting{arenaSetting.Setting()} }
