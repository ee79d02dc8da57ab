// Command grpcupstream is the gRPC service of `make bench`'s gRPC rows: grpc-go serving the
// standard grpc.health.v1 Health service (SERVING), in cleartext HTTP/2, so that the unary call
// costs as little as grpc-go can and the rows measure what sits in front of it.
package main

import (
	"flag"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:18050", "address to listen on")
	flag.Parse()
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	log.Fatal(s.Serve(l))
}
