"""Channel families: each module builds a `pram_lib.core.channel.Channel`."""
