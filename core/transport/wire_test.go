package transport

import "testing"

func TestMetadataHeaderIsCheckedBeforeTheBody(t *testing.T) {
	w := NewMetadataWriter("RTST", 2, 0)
	w.U32(7)
	good := w.Bytes()

	r, err := OpenMetadata(good, "RTST", 2)
	if err != nil {
		t.Fatalf("a header it wrote: %v", err)
	}
	if v := r.U32(); v != 7 || r.Done() != nil {
		t.Fatalf("the reader does not continue after the header: %d, %v", v, r.Done())
	}
	for name, c := range map[string]struct {
		b    []byte
		want Status
	}{
		"empty":         {nil, ErrCorrupt},
		"short":         {good[:4], ErrCorrupt},
		"other format":  {append([]byte("XTST"), good[4:]...), ErrCorrupt},
		"other version": {append([]byte("RTST\x03"), good[5:]...), ErrUnsupported},
	} {
		if _, err := OpenMetadata(c.b, "RTST", 2); StatusOf(err) != c.want {
			t.Errorf("%s: %v, want status %d", name, err, c.want)
		}
	}
}
