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
	h2c := flag.Bool("h2c", false, "also accept HTTP/2 with prior knowledge (h2c)")
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
	if *h2c {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	log.Fatal(srv.ListenAndServe())
}
