# syntax=docker/dockerfile:1
# Static build in a Go image (the go.mod toolchain version, so nothing is downloaded), run as
# non-root on distroless. Build it with `make image` (docker build -t ratelimit-proxy:<the
# chart's appVersion> .), the tag the Helm chart runs by default.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /out/ratelimit-proxy ./cmd/ratelimit-proxy && \
    CGO_ENABLED=0 go build -trimpath -o /out/demo-upstream ./cmd/demo-upstream

# The demo upstream of `make run`, for docker-compose.yaml (docker build --target demo-upstream).
FROM gcr.io/distroless/static-debian12:nonroot AS demo-upstream
COPY --from=build /out/demo-upstream /demo-upstream
USER 65532:65532
EXPOSE 3000
ENTRYPOINT ["/demo-upstream", "-listen", ":3000"]

# The gateway's image (the default target: the last stage).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ratelimit-proxy /ratelimit-proxy
# The default configuration listens on :8080 (proxy) and :9090 (admin). The ports come from the
# configuration file alone: no RATELIMIT_* variable is set here, since one would override the
# file that a ConfigMap or the chart mounts (a pod would listen where its Service does not send).
COPY configs/container.yaml /etc/ratelimit-proxy/config.yaml
# distroless' nonroot user, by number: with runAsNonRoot the kubelet can only verify a numeric
# user ("image has non-numeric user (nonroot), cannot verify user is non-root").
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/ratelimit-proxy"]
CMD ["serve", "--config", "/etc/ratelimit-proxy/config.yaml"]
