"""cosmos-robot-trainers: post-training algorithms on the shared torch core."""
