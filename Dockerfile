# syntax=docker/dockerfile:1
#
# Switchyard images, one target per command:
#   docker build --target broker       -t switchyard/broker .
#   docker build --target worker-agent -t switchyard/worker-agent .
#   docker build --target sim-engine   -t switchyard/sim-engine .
#   docker build --target loadgen      -t switchyard/loadgen .
# The default (last) target is the broker. compose.yaml builds all of them.
# Static binaries (CGO_ENABLED=0) on distroless, running as uid 65532.
# Go runtime settings are environment variables of the images (see
# "Runtime settings" in docs/operations.md); `docker run -e` overrides them.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# loadgen is optional: a tree without cmd/loadgen still builds the others.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    set -eu; mkdir -p /out; \
    for cmd in broker worker-agent sim-engine loadgen; do \
      if [ -d "cmd/$cmd" ]; then \
        CGO_ENABLED=0 GOOS="${TARGETOS:-linux}" GOARCH="${TARGETARCH:-amd64}" \
          go build -trimpath -buildvcs=false -ldflags "-s -w" -o "/out/$cmd" "./cmd/$cmd"; \
      elif [ "$cmd" != loadgen ]; then \
        echo "cmd/$cmd is missing" >&2; exit 1; \
      fi; \
    done

FROM gcr.io/distroless/static-debian12:nonroot AS runtime
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532

FROM runtime AS sim-engine
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/sim-engine"]
CMD ["--listen", "0.0.0.0:8000"]

FROM runtime AS worker-agent
# GOGC: fewer collections of a small, short-lived heap. GOMAXPROCS: the
# agent shares its node with the engine; two threads keep it off the
# engine's cores.
ENV GOGC=400 GOMAXPROCS=2
ENTRYPOINT ["/usr/local/bin/worker-agent"]

FROM runtime AS loadgen
ENTRYPOINT ["/usr/local/bin/loadgen"]

FROM runtime AS broker
EXPOSE 8080 4222
# GOGC: fewer collections of a small, short-lived heap.
ENV GOGC=400
ENTRYPOINT ["/usr/local/bin/broker"]
CMD ["--http", "0.0.0.0:8080", "--nats-listen", "0.0.0.0:4222", "--data-dir", "/tmp/nats"]
