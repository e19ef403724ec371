package nixl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// UCX's tcp timeouts add up to about the peer timeout, in the whole
// seconds the kernel's keepalive counts in, never zero.
func TestTCPTimeoutsFollowThePeerTimeout(t *testing.T) {
	for _, c := range []struct {
		pt                          time.Duration
		user, idle, interval, count string
	}{
		{2 * time.Second, "2000ms", "1s", "1s", "1"},
		{5 * time.Second, "5000ms", "2s", "1s", "3"},
		{30 * time.Second, "30000ms", "15s", "7s", "2"},
		{500 * time.Millisecond, "500ms", "1s", "1s", "1"},
	} {
		user, idle, interval, count := tcpTimeouts(c.pt)
		assert.Equal(t, [4]string{c.user, c.idle, c.interval, c.count}, [4]string{user, idle, interval, count}, "peer timeout %v", c.pt)
	}
}
