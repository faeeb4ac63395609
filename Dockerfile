# policyd's image: a static binary on scratch, running as a non-root user.
#
# `make image` builds the binary and the files below into build/ on the host,
# so this file needs no base image from a registry. Where a registry is
# reachable, the same image can be built in one step with a multi-stage
# Dockerfile (and a .dockerignore that lets the source in):
#
#	FROM golang:1.26-bookworm AS build
#	WORKDIR /src
#	COPY go.mod go.sum ./
#	RUN go mod download
#	COPY . .
#	ARG VERSION=dev
#	RUN CGO_ENABLED=0 go build -trimpath \
#	      -ldflags "-s -w -X github.com/policyd/policyd/internal/buildinfo.version=${VERSION}" -o /out/policyd ./cmd/policyd && \
#	    echo 'policyd:x:65532:65532::/data:/sbin/nologin' >/out/passwd && \
#	    echo 'policyd:x:65532:' >/out/group && \
#	    mkdir -p /out/data && chown 65532:65532 /out/data
#
#	FROM scratch
#	COPY --from=build /out/policyd /policyd
#	COPY --from=build /out/passwd /etc/passwd
#	COPY --from=build /out/group /etc/group
#	COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
#	COPY --from=build --chown=65532:65532 /out/data /data
#	USER 65532:65532
#	WORKDIR /data
#	VOLUME /data
#	EXPOSE 8080 9090 7000 8443
#	ENTRYPOINT ["/policyd"]
#	CMD ["serve"]

FROM scratch
COPY build/policyd /policyd
COPY build/passwd /etc/passwd
COPY build/group /etc/group
COPY build/ca-certificates.crt /etc/ssl/certs/
# An empty directory, so that /data (and a fresh named volume, which copies it)
# belongs to the policyd user instead of root.
COPY --chown=65532:65532 build/data /data
USER 65532:65532
WORKDIR /data
VOLUME /data
EXPOSE 8080 9090 7000 8443
ENTRYPOINT ["/policyd"]
CMD ["serve"]
