# syntax=docker/dockerfile:1
# envoy-rls: a static binary on distroless, running as nonroot.

FROM golang:1.26.8 AS build
WORKDIR /src
# Dependencies first, so a source change does not re-download modules.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The vtprotobuf tag compiles go-control-plane's generated encoders, which
# the server's gRPC codec uses for responses.
RUN CGO_ENABLED=0 go build -tags vtprotobuf -trimpath -ldflags "-s -w" -o /out/envoy-rls ./cmd/envoy-rls

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/envoy-rls /usr/local/bin/envoy-rls
# Descriptor files are read from this folder (mount your own over it); every
# flag also has an ENVOY_RLS_* environment variable (see `envoy-rls -h`).
ENV ENVOY_RLS_CONFIG_DIR=/etc/envoy-rls
COPY config/ /etc/envoy-rls/
# nonroot by number: Kubernetes' runAsNonRoot cannot verify a user name.
USER 65532:65532
# 8081: gRPC (RateLimitService v3, health, reflection); 9090: HTTP /metrics,
# /healthz, /readyz. The debug listener stays on the container's loopback.
EXPOSE 8081 9090
ENTRYPOINT ["/usr/local/bin/envoy-rls"]
