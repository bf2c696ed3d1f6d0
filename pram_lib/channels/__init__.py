"""Channel families: each module builds a `pram_lib.channel.Channel`."""
