"""The release engine: read the source in chunks, profile, choose channels, perturb, estimate, gate and publish the release folder."""
