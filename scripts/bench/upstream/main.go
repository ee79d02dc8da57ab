// Command upstream is the benchmark's guarded service: it answers every request 200 with a small
// fixed JSON body and an explicit Content-Length, so that the upstream costs as little as a Go
// HTTP server can and the measurements are about what sits in front of it.
package main

import (
	"flag"
	"log"
	"net/http"
	"strconv"
	"time"
)

var body = []byte(`{"service":"bench-upstream","ok":true}` + "\n")

func main() {
	addr := flag.String("listen", "127.0.0.1:18000", "address to listen on")
	flag.Parse()
	length := []string{strconv.Itoa(len(body))}
	ctype := []string{"application/json"}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Pre-built header values: no canonicalisation and no allocation per request.
		w.Header()["Content-Type"] = ctype
		w.Header()["Content-Length"] = length
		_, _ = w.Write(body)
	})
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
