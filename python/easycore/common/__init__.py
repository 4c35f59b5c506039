"""Framework-free tools: config, registry, paths, network, and the parallel runners."""
