package sim

import (
	"strconv"
	"testing"
	"time"
)

func TestMask(t *testing.T) {
	now := strconv.FormatInt(epoch+int64(3*time.Second), 10)
	for in, want := range map[string]string{
		`{":w":4611686018427387903}`:              `{":w":M}`,
		`{":now":` + now + `}`:                    `{":now":` + now + `}`,
		`{":ttl":946688401,":n":12}`:              `{":ttl":946688401,":n":12}`,
		`#l=l3fa9c0e1b2,#count=count`:             `#l=l#,#count=count`,
		`"pk":"71f4e69d0094851e16cbd22638dad049"`: `"pk":"71f4e69d0094851e16cbd22638dad049"`,
		`#lv=lv,#tat=tat`:                         `#lv=lv,#tat=tat`,
		`NS[123456789012345,7]`:                   `NS[M,7]`,
	} {
		if got := mask(in); got != want {
			t.Errorf("mask(%s) = %s, want %s", in, got, want)
		}
	}
}
