"""cosmos-robot-envs: Gymnasium robot envs, the vector layer and headless evaluation."""
