"""``local_spool`` mode (PROTOCOL §3.4): a batch is answered once it is durable in this
host's spool (`spool`), and a lander (`lander`) runs the acceptance protocol on it later,
remembering what it landed for the retry horizon (`landed`)."""
