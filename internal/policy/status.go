package policy

import (
	"errors"
	"strconv"
	"strings"
)

// StatusSet is a set of HTTP status codes from 100 to 599, compiled from a policy's charge_on.
// The zero StatusSet is empty. It is immutable once built and safe for concurrent reads.
type StatusSet struct {
	bits [10]uint64 // bit c%64 of word c/64 is status c
}

// Has reports whether status code c is in the set.
func (s *StatusSet) Has(c int) bool {
	if c < 0 || c >= 640 {
		return false
	}
	return s.bits[c/64]&(1<<(c%64)) != 0
}

func (s *StatusSet) add(c int) { s.bits[c/64] |= 1 << (c % 64) }

// ParseStatusSet reads charge_on entries: a status code from 100 to 599 ("401") or a class
// ("4xx", any case, from 1xx to 5xx). Errors read like `must be a status code from 100 to 599
// or a class such as 5xx`, ready to follow a field path and value.
func ParseStatusSet(list []string) (*StatusSet, error) {
	s := new(StatusSet)
	for _, v := range list {
		v = strings.TrimSpace(v)
		if len(v) == 3 && v[0] >= '1' && v[0] <= '5' && strings.EqualFold(v[1:], "xx") {
			lo := int(v[0]-'0') * 100
			for c := lo; c < lo+100; c++ {
				s.add(c)
			}
			continue
		}
		c, err := strconv.Atoi(v)
		if err != nil || len(v) != 3 || c < 100 || c > 599 {
			return nil, errors.New("must be a status code from 100 to 599 or a class such as 5xx")
		}
		s.add(c)
	}
	return s, nil
}
