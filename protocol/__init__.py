"""The contract as code (PROTOCOL.md): the frame format (`frame`, `frame_encode`), every
key in the store (`keys`: one place), every record written there (`records`), UTC hours,
clocks, the set hash, and the batch API's names on the wire
(`batch_api`). Imports nothing of this project.
"""
