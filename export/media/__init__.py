"""Media: probing videos, choosing the frame each window step gets, decoding, cropping, and the clip
and image encoders. Reads media files; knows nothing of stores, jobs or the CLI."""
