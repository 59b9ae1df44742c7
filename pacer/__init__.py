"""The pacer: releases the pods the webhook gated (`pacing.enabled`), one at a time by default,
each kept off the nodes whose labels do not yet count the pods bound to them, so that a burst
never lands two shares on a node by labels that no longer hold (docs/steering.md, "Pacing").

ledger      which nodes lag (pure)
release     which gated pod goes next and the patch that lets it go (pure)
room        whether pods that could land on one node fit there together (pure)
controller  the watches and the release loop, run by `gpuslice-controller` (controller/)

May import gpuslice.{affinity,config,contract,labelcodec,listwatch,podrequests,timeouts}; never the webhook, the device
plugin or the DRA plugin (the controller, which runs the pacer, gives it its API client).
"""
