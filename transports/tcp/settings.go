package tcp

import "github.com/rdt-project/rdt/core/transport"

// maxStreams bounds RDT_TCP_STREAMS.
const maxStreams = 16

// streamsSetting is the environment variable tcp reads, through
// Host.Settings.
var streamsSetting = transport.IntSetting{Name: "RDT_TCP_STREAMS", Default: 4, Min: 1, Max: maxStreams,
	Meaning: "connections one large tcp fetch is split over"}

// Settings are tcp's rows of the runtime's table of environment variables.
func Settings() []transport.Setting { return []transport.Setting{streamsSetting.Setting()} }
