"""Generated from the .proto files beside this file by scripts/gen_alpasim_proto.sh; do not edit the
``*_pb2*`` modules by hand. The .proto files restate AlpaSim's wire contract (see their headers)."""
