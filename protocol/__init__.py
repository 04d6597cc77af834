"""The contract as code (PROTOCOL.md): the frame format (`frame`, `frame_encode`), every
key in the store (`keys`: one place), every record written there (`records`), UTC hours,
clocks and the set hash. Imports nothing of this project.
"""
