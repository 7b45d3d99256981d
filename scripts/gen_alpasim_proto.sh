#!/usr/bin/env bash
# Regenerate the Python modules of policy_server/src/cosmos_robot_server/alpasim/proto/ from its .proto files.
# Usage: scripts/gen_alpasim_proto.sh        (then commit the changed *_pb2.py, *_pb2.pyi, *_pb2_grpc.py)
#
# The generator is pinned (GRPC_TOOLS_VERSION, in a venv of its own: .venv-protoc) because generated code
# checks at import time that the runtime is at least as new as the generator: grpcio-tools 1.64.1 emits
# protobuf 5.26.1 gencode and a grpcio 1.64.1 check, which is why the [alpasim] extra of
# cosmos-robot-server asks for grpcio>=1.64.1 and protobuf>=5.26.1. Raise all three together.
# tests/policy_server/test_alpasim.py checks that the committed modules match the .proto files.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_VERSION="${GRPC_TOOLS_VERSION:-1.64.1}"
VENV=.venv-protoc
SRC=policy_server/src
PROTO_DIR=cosmos_robot_server/alpasim/proto

have="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)"
if [ "$have" != "$TOOLS_VERSION" ]; then
  echo "gen_alpasim_proto: installing grpcio-tools==$TOOLS_VERSION into $VENV"
  test -x "$VENV/bin/python" || "$(scripts/find_python.sh 3.12)" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "grpcio-tools==$TOOLS_VERSION"
fi

protoc=("$VENV/bin/python" -m grpc_tools.protoc -I "$SRC")
# messages (+ type stubs) for every file; service stubs only where a service is declared
"${protoc[@]}" --python_out="$SRC" --pyi_out="$SRC" "$SRC/$PROTO_DIR"/{common,sensorsim,egodriver}.proto
"${protoc[@]}" --grpc_python_out="$SRC" "$SRC/$PROTO_DIR/egodriver.proto"
echo "gen_alpasim_proto: regenerated $SRC/$PROTO_DIR with grpcio-tools $TOOLS_VERSION"
