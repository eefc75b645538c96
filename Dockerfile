# Multi-stage build of batchmr's commands: worker, scheduler and the
# pagination example (for seeding and checking the demo table).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/worker ./cmd/worker \
 && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/scheduler ./cmd/scheduler \
 && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/pagination ./examples/pagination

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot
ENTRYPOINT ["/usr/local/bin/worker"]
