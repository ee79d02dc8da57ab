package proxy

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AdminHandler serves the admin port:
//
//   - /metrics: the metrics gathered from g (Prometheus text or OpenMetrics, as negotiated;
//     exemplars only in OpenMetrics);
//   - /healthz: 200 "ok" while the process serves (liveness);
//   - /readyz: 200 "ok" when ready(ctx) returns nil, else 503 with the error's text (readiness:
//     for instance the store is unreachable). A nil ready is always ready. ready receives the
//     probe request's context and should honour it;
//   - anything else: 404.
//
// It is a separate handler from the proxy's so that these paths never shadow the upstream's.
func AdminHandler(g prometheus.Gatherer, ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			if err := ready(r.Context()); err != nil {
				writeText(w, http.StatusServiceUnavailable, err.Error())
				return
			}
		}
		writeText(w, http.StatusOK, "ok")
	})
	return mux
}

func writeText(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
