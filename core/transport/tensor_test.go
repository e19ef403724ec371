package transport

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Join makes one span of views that touch, and only of those.
func TestJoin(t *testing.T) {
	buf := make([]byte, 64)
	joined, ok := Join(buf[0:16], buf[16:40])
	assert.True(t, ok)
	assert.Equal(t, 40, len(joined))
	assert.Same(t, &buf[0], &joined[0])
	for _, pair := range [][2][]byte{
		{buf[0:16], buf[17:40]}, // a gap
		{buf[16:40], buf[0:16]}, // the wrong order
		{buf[0:16], buf[8:40]},  // an overlap
		{buf[0:0], buf[0:16]},   // empty
		{buf[0:16], buf[16:16]}, // empty
		{buf[0:16], make([]byte, 8)},
	} {
		_, ok := Join(pair[0], pair[1])
		assert.False(t, ok)
	}
}
