package proxy

import (
	"io"
	"log"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// ScrubLog makes every line of l pass through ps.ScrubAddrs before it reaches l's output, so
// that the client addresses net/http puts in its own error lines (HTTP/1 and HTTP/2 connection
// errors, TLS handshake errors) reach the log as pseudonyms. It returns l.
func ScrubLog(l *log.Logger, ps *policy.Pseudonyms) *log.Logger {
	l.SetOutput(scrubWriter{w: l.Writer(), ps: ps})
	return l
}

type scrubWriter struct {
	w  io.Writer
	ps *policy.Pseudonyms
}

func (s scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(s.w, s.ps.ScrubAddrs(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// clientErrField is the "error" field of a log line about an error on the client's connection
// (`read tcp A->B: i/o timeout` names both ends): its addresses as pseudonyms.
func (h *Handler) clientErrField(err error) zap.Field {
	return zap.String("error", h.pseudonyms.ScrubAddrs(err.Error()))
}
