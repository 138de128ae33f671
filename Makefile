# The two commands of the README: `make run` (the main job) and `make test` (every check).
CARGO ?= cargo
RELEASE_BIN := target/release/multigrain

.PHONY: run test deps build bench clean

deps:
	@./scripts/install-deps.sh

build: deps
	$(CARGO) build --release --locked

## The main job (see README).
run: build
	$(RELEASE_BIN) run water

## Formatting, lints, docs, every test (unit, property, loom, multi-process).
test: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	RUSTDOCFLAGS=-Dwarnings $(CARGO) doc --workspace --no-deps --locked
	$(CARGO) test --workspace --locked
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) clippy -p multigrain-messaging --test loom --release --locked -- -D warnings
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test -p multigrain-messaging --test loom --release --locked

## Criterion benchmarks (long; machine should be idle).
bench: deps
	$(CARGO) bench --workspace --locked

clean:
	$(CARGO) clean
