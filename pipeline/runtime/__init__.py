"""How the stages run: in this process or one OS process per stage, their stats and engines."""
