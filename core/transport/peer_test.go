package transport

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAddressKeysAreHiddenAndStripped(t *testing.T) {
	const keyed = "unix:///run/user@host/rt-1.sock,tcp://s3cret@127.0.0.1:5000"
	assert.Equal(t, "unix:///run/user@host/rt-1.sock,tcp://****@127.0.0.1:5000", RedactAddress(keyed))
	assert.Equal(t, "unix:///run/user@host/rt-1.sock,tcp://127.0.0.1:5000", StripAddressKeys(keyed))
	// A TCP part without a key stays as it is, even where another part has an '@'.
	const keyless = "unix:///run/user@host/rt-1.sock,tcp://127.0.0.1:5000"
	assert.Equal(t, keyless, RedactAddress(keyless))
	assert.Equal(t, keyless, StripAddressKeys(keyless))
	assert.NotContains(t, Errorf(ErrTimeout, "connecting to %s", keyed).Error(), "s3cret")
}
