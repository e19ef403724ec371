package transporttest

import (
	"encoding/hex"
	"reflect"
	"testing"
)

// PinnedEncoding is a transport's golden test of its metadata codec:
// encode(m) is golden (hex), and golden decodes to m. Refs made by earlier
// builds must decode the same, so a change of golden is a change of
// format, which needs a new metadata version. It returns golden's bytes,
// for checks of how other versions of them decode.
func PinnedEncoding[M any](t testing.TB, m M, golden string, encode func(M) []byte, decode func([]byte) (M, error)) []byte {
	t.Helper()
	if got := hex.EncodeToString(encode(m)); got != golden {
		t.Errorf("the encoding changed:\n got %s\nwant %s", got, golden)
	}
	b, err := hex.DecodeString(golden)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Errorf("the golden bytes decode to %+v, want %+v", got, m)
	}
	return b
}
