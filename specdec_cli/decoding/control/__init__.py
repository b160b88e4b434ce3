"""The adaptive controller: each round, which drafter drafts and how much (or nothing).

``adaptive.AdaptiveK`` decides for one scenario from round events alone; ``controller`` keeps one
per scenario, seeded by ``priors`` from the pair's calibration profile; ``estimates`` holds what it
knows of each drafter (acceptance by position, costs); ``gate`` stops a learned drafter where its
confidence says the next guess will not pay; ``speedup`` is the speed-up model it and calibration
share. Pure bookkeeping: no models, no clocks, no files.
"""
