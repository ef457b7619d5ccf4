"""Stage generate: completions from a model server (distilabel), scored by the rewards."""
