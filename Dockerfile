# syntax=docker/dockerfile:1
# Static build in a Go image (the go.mod toolchain version, so nothing is downloaded), run as
# non-root on distroless.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /out/ratelimit-proxy ./cmd/ratelimit-proxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ratelimit-proxy /ratelimit-proxy
COPY configs/example.yaml /etc/ratelimit-proxy/config.yaml
# Inside a container the example's loopback addresses would be unreachable; a pod reaches the
# proxy on :8080 and Prometheus scrapes :9090 (keep 9090 off any Service or Ingress).
ENV RATELIMIT_LISTEN=:8080 RATELIMIT_ADMIN_LISTEN=:9090
# distroless' nonroot user, by number: with runAsNonRoot the kubelet can only verify a numeric
# user ("image has non-numeric user (nonroot), cannot verify user is non-root").
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/ratelimit-proxy"]
CMD ["serve", "--config", "/etc/ratelimit-proxy/config.yaml"]
