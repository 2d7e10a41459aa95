# Everyday targets; CI runs .ci/run.
.PHONY: test run proto bench

test:
	bash .ci/run

run:
	go run ./cmd/broker --demo

# Regenerate protobuf code (needs protoc, protoc-gen-go v1.36.12 and
# protoc-gen-go-grpc v1.6.0 on PATH). The generated files are committed.
proto:
	go generate ./wire ./api/... ./vllmpb

bench:
	go test -run '^$$' -bench . -benchmem ./dispatch ./e2e
