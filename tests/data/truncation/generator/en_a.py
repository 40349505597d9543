from dsl import C, T, TOOL

CONVOS = []

# 1 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-travel-kyoto-ryokan",
        lang="en",
        schema="openai.chat",
        system="You are a helpful personal assistant. Answer clearly and keep it practical.",
        turns=[
            T(
                "Can you help me write a polite email to my landlord asking him to fix the radiator in the bedroom? It's been cold for a week.",
                "Sure. Subject: Bedroom radiator not heating. 'Hi Mark, I hope you're well. The radiator in the bedroom has stopped heating for about a week now; the other radiators work fine, so it may be a valve or trapped air. Could you arrange for someone to take a look this week? I'm home most evenings after 6 and can also leave a key with the neighbour. Thanks very much, Priya.' Keep it short and specific so it's easy to act on.",
            ),
            T(
                "What's a good stretching routine for lower back stiffness after sitting all day?",
                "Try this 10-minute sequence in the evening: cat-cow for 10 slow reps, child's pose for 45 seconds, knee-to-chest stretch for 30 seconds per side, a supine figure-four (piriformis) stretch for 30 seconds per side, and a gentle lying spinal twist. Finish with 10 glute bridges, since weak glutes often make the lower back do extra work. Move slowly, breathe out into each stretch, and stop if anything causes sharp or radiating pain.",
            ),
            T(
                "I'm going to Kyoto in April for four nights and want to stay in a traditional ryokan, not too far from Gion. Any suggestions around $300-500 a night?",
                "A few that fit well: Gion Hatanaka is a short walk from Yasaka Shrine, includes a multi-course kaiseki dinner and has a large communal cedar bath. Ryokan Motonago is smaller and family-run near Kodaiji temple, with rooms looking onto a little garden. If you don't mind a taxi ride, Yoshida-sanso in the northern hills is quieter and very atmospheric. April is cherry blossom season, so book soon and check whether the rate includes dinner, since prices differ a lot with and without meals.",
            ),
            T(
                "How do I convert a column of dates stored as text in Excel into real dates?",
                "If the text looks like a normal date, select the column, go to Data > Text to Columns, click Next twice, choose 'Date' with the right order (for example DMY), and finish; Excel converts them in place. Alternatively use =DATEVALUE(A2) in a helper column and format it as a date. If they still stay as text, check for leading spaces with =TRIM() or non-breaking spaces copied from a website.",
            ),
            T(
                "Give me a quick 20-minute dinner idea with chickpeas and spinach.",
                "Make a quick chickpea and spinach curry: soften a chopped onion in oil, add two cloves of garlic, a teaspoon of grated ginger and two teaspoons of curry powder, then stir in a drained can of chickpeas and a can of chopped tomatoes. Simmer for 10 minutes, fold in two big handfuls of spinach until wilted, and finish with a splash of coconut milk or yoghurt and lemon juice. Serve with rice or warm flatbread.",
            ),
            T(
                "What's the difference between a Roth IRA and a traditional IRA, in one paragraph?",
                "With a traditional IRA you may get a tax deduction now, the money grows tax-deferred, and withdrawals in retirement are taxed as ordinary income. With a Roth IRA you contribute after-tax money, so there's no deduction today, but qualified withdrawals, including all the growth, are tax-free. Roughly, a Roth wins if you expect a higher tax rate in retirement than now, and a traditional IRA wins if you expect a lower one. Roth contributions also have income limits.",
            ),
            T(
                "Can you suggest a board game for 5 people that takes under an hour?",
                "Good options: Codenames plays great with 5 in two teams and takes about 20 minutes. Just One is a cooperative word-guessing game that's very easy to teach. The Crew is a cooperative trick-taking game for people who like a puzzle. If your group likes bluffing, Skull or The Resistance work well at five and rarely run over 30 minutes. For a slightly heavier option, try 7 Wonders, which plays in about 35 minutes regardless of player count.",
            ),
            TOOL(
                "How much is 45,000 yen in US dollars right now?",
                [
                    (
                        "convert_currency",
                        {"amount": 45000, "from": "JPY", "to": "USD"},
                        '{"amount": 45000, "from": "JPY", "to": "USD", "rate": 0.00664, "result": 298.8}',
                    )
                ],
                "45,000 yen is about $298.80 at today's rate of 0.00664 USD per yen. If you pay by card, most networks add a 1-3% foreign transaction fee unless your card waives it, so budget closer to $305. Exchanging cash at an airport kiosk usually gives a noticeably worse rate than withdrawing from a local ATM.",
            ),
            T(
                "My cat keeps scratching the couch. What actually works?",
                "Give her a better option right next to the couch: a tall, heavy scratching post covered in sisal that doesn't wobble, since cats like to stretch fully. Make the couch unappealing with double-sided tape or a throw for a few weeks, and reward her with a treat whenever she uses the post. Keeping claws trimmed every two weeks reduces damage. Never punish her, because that tends to move the scratching somewhere else rather than stop it.",
            ),
            T(
                "Explain what git stash is and when I'd use it.",
                "git stash takes your uncommitted changes, saves them on a stack, and resets your working tree to the last commit. It's handy when you need to switch branches quickly, for example to fix an urgent bug, without committing half-finished work. Run 'git stash' to save, 'git stash list' to see entries, and 'git stash pop' to reapply the latest one. Add '-u' if you also want to stash untracked files.",
            ),
            T(
                "Recommend a history podcast that isn't too dry.",
                "Try 'The Rest Is History', where two British historians chat about everything from the Romans to the Beatles with lots of humour. 'Hardcore History' by Dan Carlin is long but gripping, more like an audiobook with drama. For short episodes, 'History Extra' covers a topic in 30-40 minutes with expert guests. If you like narrative storytelling, 'Revolutions' by Mike Duncan walks through major revolutions one episode at a time.",
            ),
            T(
                "How long should I boil eggs for jammy yolks?",
                "Lower fridge-cold eggs into water that's already at a rolling boil and cook them for 6 and a half minutes, then move them straight into ice water for at least 2 minutes. That gives set whites and a thick, jammy yolk. Go 6 minutes for a runnier centre or 7 minutes for just-set. Peeling is easier under running water, starting from the wide end where the air pocket is.",
            ),
        ],
        dep=2,
        final="Back to the ryokan idea for my Kyoto trip: the one with the big cedar bath, do they do a vegetarian version of the kaiseki dinner if I ask ahead?",
        note="Needs the ryokan list to know which one has the cedar bath (Gion Hatanaka) and that its rate includes kaiseki dinner.",
    )
)

# 2 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-weather-lisbon-sintra",
        lang="en",
        schema="openai.chat",
        system="You are a helpful assistant with access to a weather tool.",
        turns=[
            T(
                "I need a short bio for a conference program. I'm a data engineer with 8 years of experience building streaming pipelines. Three sentences max.",
                "Here's a draft: 'Alex Moreno is a data engineer with eight years of experience designing and running real-time streaming pipelines at scale. He has built event-driven platforms on Kafka and Flink that process billions of events a day for analytics and fraud detection. Alex cares about reliability, clear data contracts and making streaming approachable for the teams that depend on it.' Swap in your name and any specific companies you're happy to mention.",
            ),
            TOOL(
                "What's the weather looking like in Lisbon this Saturday? I'm thinking about a day trip to Sintra.",
                [
                    (
                        "get_weather",
                        {"city": "Lisbon", "date": "2025-05-17"},
                        '{"city": "Lisbon", "date": "2025-05-17", "summary": "Sunny morning, showers from about 14:00", "temp_c": {"min": 14, "max": 21}, "precip_prob": {"morning": 10, "afternoon": 80, "evening": 60}, "wind_kph": 22}',
                    )
                ],
                "Saturday in Lisbon looks split in two: a sunny morning with only about a 10% chance of rain, then showers likely from around 2 pm (80% in the afternoon, 60% in the evening). Temperatures run from 14 to 21 degrees with a fairly breezy 22 km/h wind. Keep in mind Sintra sits higher and is usually cooler and mistier than the city, so expect it to feel a few degrees colder there.",
            ),
            T(
                "How do I remove a stripped screw from a cabinet hinge?",
                "First try pressing a wide rubber band between the screwdriver and the screw head for extra grip, and push hard while turning slowly. If that fails, use a screw extractor bit: drill a small pilot hole, then run the extractor counter-clockwise. For a shallow screw, you can sometimes grab the head with locking pliers and twist it out. When you replace it, use a slightly longer screw or fill the hole with a toothpick and glue so it bites again.",
            ),
            T(
                "Can you recommend a beginner-friendly houseplant for a north-facing window?",
                "A ZZ plant is close to indestructible: it tolerates low light and only needs watering every two to three weeks. Pothos is another easy choice that trails nicely and tells you when it's thirsty by drooping a little. Snake plants and cast iron plants also cope well with dim rooms. Whatever you pick, the most common mistake is overwatering, so let the top few centimetres of soil dry out before watering again.",
            ),
            T(
                "What's the cleanest way to reverse a linked list in Python? Iterative is fine.",
                "Walk the list once while flipping pointers: keep 'prev = None' and 'cur = head', then in a loop save 'nxt = cur.next', set 'cur.next = prev', move 'prev = cur' and 'cur = nxt'. When cur becomes None, prev is the new head, so return it. It runs in O(n) time and O(1) extra space. Draw three nodes on paper once and trace it; that makes the pointer juggling stick.",
            ),
            T(
                "My 7-year-old asked why the sky is blue. How do I explain it simply?",
                "You could say: sunlight looks white, but it's actually made of all the colours mixed together. When it comes through the air, the tiny bits of air bump the blue light around much more than the red or yellow light, so blue gets scattered all over the sky and comes at our eyes from every direction. At sunset the light travels through much more air, the blue gets scattered away, and we see the oranges and reds instead.",
            ),
            T(
                "Summarize the main idea of Atomic Habits in a few sentences.",
                "James Clear argues that big results come from small habits compounding over time, so focus on systems rather than goals. He offers four laws for building habits: make them obvious, attractive, easy and satisfying, and invert them to break bad ones. A key idea is identity-based habits: instead of aiming to run a marathon, aim to become 'a runner' and let each small action be a vote for that identity. Environment design matters more than willpower.",
            ),
            T(
                "What's a reasonable daily protein target if I weigh 70 kg and lift three times a week?",
                "Most sports nutrition guidance lands around 1.6 to 2.2 grams of protein per kilogram of body weight for people doing resistance training, so about 110 to 150 grams a day for you. Aim for 25-40 grams per meal spread over three or four meals, which is easier than hitting one huge serving. Eggs, Greek yoghurt, chicken, tofu, lentils and whey are convenient sources. If you have kidney problems, check with a doctor first.",
            ),
            T(
                "Suggest a few names for a small bakery that focuses on rye breads.",
                "Some ideas: 'Rye & Shine' if you want something playful, 'Dark Crumb' for a moody artisan feel, 'The Rye House' as a classic option, 'Caraway' named after the seed that often goes into rye loaves, or 'Northern Loaf' to hint at the Scandinavian and Baltic baking tradition. Before settling, check that the name is free as a domain and on Instagram, and say it out loud to make sure it's easy to remember.",
            ),
            T(
                "How do I politely decline a meeting invite that has no agenda?",
                "You can decline with a tentative note instead of a flat no: 'Thanks for including me. Could you share a quick agenda or the decision you need from me? I want to make sure I can add something useful before blocking the time.' If it turns out you're not needed, they'll usually tell you. For recurring meetings, ask whether an async update would cover your part, which often saves everyone time.",
            ),
            T(
                "What's the difference between 'affect' and 'effect'?",
                "Most of the time, 'affect' is a verb meaning to influence something ('The rain affected our plans') and 'effect' is a noun meaning the result ('The rain had a big effect on our plans'). A handy memory trick is 'A for action, E for end result'. The exceptions: 'effect' as a verb means to bring about ('to effect change'), and 'affect' as a noun is a psychology term for displayed emotion.",
            ),
        ],
        dep=1,
        final="Going back to the forecast you looked up, if I do Sintra that day, should I see Pena Palace first thing or leave it until after lunch?",
        note="Needs the Saturday forecast from the weather tool: sunny morning (10% rain), showers from ~14:00 (80%), so do Pena Palace in the morning.",
    )
)

# 3 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-code-pandas-merge-rows",
        lang="en",
        schema="openai.chat",
        system="You are a knowledgeable assistant. Be concise.",
        turns=[
            T(
                "Can you suggest a warm-up routine before playing tennis?",
                "Spend about ten minutes: start with three minutes of light jogging or skipping around the court, then do dynamic moves like leg swings, walking lunges with a twist, arm circles and side shuffles. Follow with some shadow swings for forehand, backhand and serve at half speed. Finish with mini-tennis from the service line before moving back. Save static stretching for after the match, when your muscles are warm.",
            ),
            T(
                "What should I pack for a weekend camping trip in early autumn?",
                "Think in layers because nights can drop close to freezing: a base layer, a fleece, an insulated jacket and a rain shell, plus a warm hat and spare socks. Bring a sleeping bag rated a few degrees below the forecast low and an insulated sleeping pad, which matters as much as the bag. Add a headlamp with spare batteries, a stove with enough fuel for hot drinks, a first aid kit, and food that's easy to cook in the dark.",
            ),
            T(
                "How do I make cold brew coffee concentrate at home?",
                "Use a 1:4 ratio by weight, for example 100 g of coarsely ground coffee to 400 g of cold water. Stir so all the grounds are wet, cover, and leave it at room temperature for 14-18 hours. Strain through a fine sieve and then a paper filter or cloth to remove the sludge. It keeps in the fridge for about a week; dilute it roughly 1:1 with water or milk over ice when you drink it.",
            ),
            T(
                "Write me a haiku about a rainy Monday.",
                "Grey drizzle taps glass / the kettle sighs its warm steam / Monday starts slowly. If you'd like a different mood, here's a more upbeat one: Puddles on the street / my umbrella blooms bright red / rain can't stop my stride. Haiku traditionally include a seasonal reference, so rain works nicely for spring or autumn.",
            ),
            T(
                "What's the actual rule for when to use 'whom'?",
                "Use 'whom' when it's the object of a verb or preposition, and 'who' when it's the subject. The quick test: answer the question with 'he' or 'him'. If 'him' fits, use 'whom' ('Whom did you call?' - 'I called him'). If 'he' fits, use 'who' ('Who called?' - 'He called'). In casual speech 'who' is fine almost everywhere, but after a preposition ('to whom', 'with whom') 'whom' still sounds correct.",
            ),
            T(
                "After I merge orders with customers in pandas, my row count goes from 10k to 13k. What's going on?",
                "That almost always means the key isn't unique on the right side: the customers frame has duplicate customer_id rows, so each order matches several customer records and gets repeated. Check with customers['customer_id'].duplicated().sum(). Fix it by deduplicating customers first, for example sorting by updated_at and using drop_duplicates('customer_id', keep='last'). Then pass validate='many_to_one' to merge so pandas raises a MergeError if the right-hand keys are ever duplicated again.",
            ),
            T(
                "What's a good way to keep basil fresh for more than two days?",
                "Treat it like cut flowers: trim the stems, stand the bunch in a glass of water, and keep it on the counter away from direct sun, loosely covered with a plastic bag. Don't refrigerate it, because the cold turns the leaves black. Change the water every day or two. If you have more than you can use, blend it with olive oil and freeze it in an ice cube tray for later sauces.",
            ),
            T(
                "Explain the difference between TCP and UDP to a non-technical manager.",
                "TCP is like sending a parcel with tracking and signature required: every piece is numbered, checked on arrival, and resent if lost, so it's reliable but a bit slower. UDP is like shouting announcements across a room: fast and lightweight, but if someone misses a word, nobody repeats it. We use TCP for things that must be complete, like web pages and payments, and UDP for things where speed matters more, like video calls and online games.",
            ),
            T(
                "Can you give me three icebreaker questions for a team offsite?",
                "Here are three that work with most groups: 'What's a skill you have that wouldn't show up on your CV?', 'What was your first ever job, and what did it teach you?', and 'If you could instantly master one thing, what would it be?' They're personal enough to be interesting without being awkward. Go around quickly, keep answers to about a minute, and let the facilitator answer first to set the tone.",
            ),
            T(
                "Is it worth paying off a 4% car loan early, or should I invest instead?",
                "Paying it off is a guaranteed 4% return, with no risk. Investing in a broad index fund has historically returned more over long periods, but with volatility. If you already have an emergency fund, get any employer retirement match, and are comfortable with market swings, investing usually comes out ahead over 5+ years. If the debt stresses you or your horizon is short, paying it down is perfectly reasonable. Splitting extra money between both is a fine compromise.",
            ),
            T(
                "Recommend a sci-fi novel similar to Project Hail Mary.",
                "Try 'The Martian' if you haven't already, since it's by the same author and has the same problem-solving humour. Beyond Andy Weir, 'Children of Time' by Adrian Tchaikovsky has fascinating alien intelligence and big ideas. 'The Long Way to a Small, Angry Planet' by Becky Chambers is warmer and more character-driven. 'Seveneves' by Neal Stephenson is heavier but full of hard-science survival engineering.",
            ),
            T(
                "How do I clean a cast iron pan that has rust spots?",
                "Scrub the rust off with steel wool and a little warm water, or a paste of coarse salt and oil, until you see bare grey metal. Rinse, dry it immediately and thoroughly, then warm it on the stove for a few minutes to drive off moisture. Rub a very thin layer of oil all over, wipe off the excess, and bake it upside down at 230 C for an hour. Repeat once or twice to rebuild the seasoning.",
            ),
            T(
                "What's a quick way to memorize the order of the planets?",
                "The classic mnemonic is 'My Very Educated Mother Just Served Us Noodles': Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune. Making your own silly sentence often sticks even better, especially if it's about someone you know. It also helps to remember the split: four small rocky planets close to the Sun, then the gas giants Jupiter and Saturn, then the ice giants Uranus and Neptune.",
            ),
            T(
                "How many hours of sleep does a teenager actually need?",
                "Sleep experts recommend 8 to 10 hours a night for teenagers aged 13 to 18. Their body clocks also naturally shift later during puberty, which is why many struggle to fall asleep before 11 pm and find early school starts hard. Consistent wake times, even on weekends, dimmer screens in the hour before bed, and avoiding caffeine after lunch help the most. Chronic short sleep affects mood, concentration and sports performance.",
            ),
        ],
        dep=5,
        final="About the join that inflated my row count earlier: what was the validate option you told me to pass, and would it also catch duplicate keys on the orders side?",
        note="Needs the pandas merge turn: validate='many_to_one' was suggested (it only checks the right/customers side; duplicates in orders are allowed).",
    )
)

# 4 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-finance-mortgage-extra",
        lang="en",
        schema="anthropic.messages",
        blocks=True,
        system="You are a concise assistant helping the user with personal finance and everyday household tasks.",
        turns=[
            T(
                "Can you help me come up with a weekly chore chart for two kids aged 8 and 11?",
                "Here's a simple split. Daily for both: make their bed, put dirty clothes in the hamper, clear their own plate. The 8-year-old: feed the pet, set the table, match socks from the laundry, water plants on Saturday. The 11-year-old: load or unload the dishwasher, take out recycling, vacuum one room, help cook one dinner a week. Rotate a bonus job weekly and use a sticker or points column so they can see progress.",
            ),
            T(
                "What's a good substitute for buttermilk in pancakes?",
                "Stir one tablespoon of lemon juice or white vinegar into a cup of regular milk and let it sit for five to ten minutes until it curdles slightly; that works almost exactly like buttermilk. Plain yoghurt or kefir thinned with a little milk to pourable consistency also works well and gives a slightly tangier flavour. Keep the baking soda in the recipe, since it needs the acid to make the pancakes rise.",
            ),
            T(
                "How do I stop my bathroom mirror from fogging up after a shower?",
                "Run the extractor fan during the shower and for 15-20 minutes after, and crack the door or window if you can. For the mirror itself, wipe on a thin layer of shaving cream or a drop of dish soap and buff it off with a dry cloth; it leaves an invisible film that stops condensation for a week or two. Anti-fog sprays for car windows work too. A heated mirror pad is the permanent fix.",
            ),
            TOOL(
                "We're looking at a $420,000 loan. What would the monthly payment be on a 30-year fixed at 6.5%?",
                [
                    (
                        "calc_mortgage",
                        {"principal": 420000, "annual_rate_pct": 6.5, "years": 30},
                        '{"monthly_payment": 2654.69, "num_payments": 360, "total_paid": 955686.85, "total_interest": 535686.85}',
                    )
                ],
                "On a $420,000 loan at 6.5% fixed for 30 years, principal and interest come to about $2,654.69 a month. Over the full 360 payments you'd pay roughly $535,687 in interest, more than the amount borrowed. Remember that this excludes property tax, homeowners insurance and any PMI, which together often add several hundred dollars a month, so ask the lender for the full escrow estimate.",
                pre="I'll run the numbers with the mortgage calculator.",
            ),
            T(
                "Give me a packing checklist for flying with a toddler.",
                "In the carry-on: diapers for the flight plus a few extra, wipes, a change of clothes for the toddler and a spare shirt for you, snacks in small containers, an empty sippy cup to fill after security, a couple of new small toys or stickers, a tablet with downloaded shows and kid headphones, any medication, and a light blanket. Bring something to suck or drink during takeoff and landing to help with ear pressure.",
            ),
            T(
                "What's the difference between baking soda and baking powder?",
                "Baking soda is pure sodium bicarbonate; it needs an acid in the recipe, like buttermilk, yoghurt or brown sugar, to react and make bubbles, and it's about three to four times stronger. Baking powder is baking soda already mixed with a dry acid and some starch, so it only needs moisture and heat. That's why recipes with acidic ingredients often use soda, while plain ones use powder. Too much soda leaves a soapy, metallic taste.",
            ),
            T(
                "How can I get better at remembering people's names?",
                "Say the name back straight away ('Nice to meet you, Daniela'), then use it once more naturally during the conversation. Link it to something vivid: a famous person with the same name, or a mental image that rhymes with it. Right after the conversation, jot the name and one detail in your phone's notes. Most forgetting happens because we're thinking about what to say next instead of listening when the name is said.",
            ),
            T(
                "Write a two-sentence out-of-office message for next week.",
                "'Thanks for your email. I'm out of the office from Monday 9 June to Friday 13 June with limited access to email, and will reply when I'm back; for anything urgent please contact Sam Lee at sam.lee@example.com.' Adjust the dates and the backup contact, and consider setting a separate, shorter version for external senders.",
            ),
            T(
                "Which is better for a small balcony: herbs or cherry tomatoes?",
                "It depends mostly on sun. Cherry tomatoes need six to eight hours of direct sun, a large pot of at least 20 litres, daily watering in summer and a stake or cage. Herbs are far more forgiving: parsley, mint and chives cope with partial shade and small pots. If your balcony is sunny and south-facing, one tomato plant plus a trough of basil and thyme gives you the best of both.",
            ),
            T(
                "What's a fun science experiment I can do with kids using kitchen stuff?",
                "Try a homemade lava lamp: fill a clear bottle a quarter full of water with a few drops of food colouring, top it up with vegetable oil, and drop in a piece of an effervescent tablet. Coloured bubbles rise and fall through the oil. It's a nice way to talk about density and gas. Another classic is red cabbage juice as a pH indicator; it changes colour with lemon juice, vinegar and baking soda.",
            ),
        ],
        dep=3,
        final="If we paid an extra $300 a month on top of the payment for that loan you ran the numbers on, roughly how much sooner would it be paid off?",
        note="Needs the calc_mortgage tool result: $420,000 at 6.5% over 30 years, $2,654.69/month (extra $300 pays off in ~22.75 years).",
    )
)

# 5 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-health-half-marathon-plan",
        lang="en",
        schema="anthropic.messages",
        system="You are a friendly, practical assistant.",
        turns=[
            T(
                "What's the best way to learn touch typing as an adult?",
                "Use a free trainer like keybr.com or Typing.com for 15-20 minutes a day, and cover your hands with a towel if you can't resist looking. Focus on accuracy first; speed comes on its own once the finger positions are automatic. Expect your normal typing to slow down for a couple of weeks while you switch over, which is the hardest part. Most adults reach their old speed in about a month and keep improving after that.",
            ),
            T(
                "Can you explain what an index fund is?",
                "An index fund is a fund that simply buys all, or a representative sample, of the companies in a market index, like the S&P 500, instead of trying to pick winners. Because nobody is paid to research and trade stocks, fees are very low, often under 0.1% a year. You get broad diversification in a single purchase, and over long periods most actively managed funds fail to beat their index after fees.",
            ),
            T(
                "I have leftover rice, eggs and frozen peas. Dinner idea?",
                "That's a classic egg fried rice. Heat a wok or large pan until very hot, add oil, scramble two or three eggs and set them aside. Add more oil, then the cold rice, breaking up clumps, and fry for a few minutes until it starts to crisp. Toss in the peas, a splash of soy sauce and a pinch of sugar, then fold the egg back in. Spring onions, garlic or a little sesame oil make it even better.",
            ),
            T(
                "How do I write a thank-you note to my kid's teacher at the end of the year?",
                "Keep it short and specific. Open with thanks, mention one concrete thing the teacher did ('the way you encouraged Mia to read aloud gave her so much confidence'), note the change you saw in your child, and close with good wishes for the summer. Three or four sentences is plenty. If your child adds a drawing or a line of their own, it usually means more to the teacher than any gift.",
            ),
            T(
                "What's the difference between a virus and a bacterium?",
                "Bacteria are single-celled living organisms that can reproduce on their own; many are harmless or helpful, and infections they cause can often be treated with antibiotics. Viruses are much smaller and can't reproduce by themselves; they hijack your cells to make copies, so antibiotics don't work on them. Colds and flu are viral, while strep throat and most urinary tract infections are bacterial.",
            ),
            T(
                "How do I get rid of fruit flies in the kitchen?",
                "First remove what they breed on: ripe fruit on the counter, the compost bin and damp sponges, and rinse recyclables. Then set a trap: a small jar with apple cider vinegar and a drop of dish soap, covered with plastic wrap poked with a few holes. The soap breaks the surface tension so they sink. Pour boiling water down the sink drain for a few days too, because they often breed in the gunk there.",
            ),
            T(
                "Suggest a weekend itinerary for Edinburgh.",
                "Saturday: walk the Royal Mile from the castle down to Holyrood, stop at St Giles' Cathedral, and climb Arthur's Seat in the afternoon for the view. Have dinner in the Old Town and maybe a ghost tour. Sunday: explore Dean Village and walk the Water of Leith path to Stockbridge market, then visit the National Museum of Scotland, which is free. End with a drink on Victoria Street or in Leith.",
            ),
            T(
                "What's a polite way to ask a coworker to stop talking so loudly on calls?",
                "Keep it private and friendly, and frame it around your work rather than their behaviour: 'Hey, quick one, when you're on calls I sometimes can't focus on mine. Would you mind using a headset or grabbing a meeting room for the longer ones?' Most people genuinely don't realise how loud they are. If it keeps happening, it's fair to raise it with your manager as a general office-noise issue rather than a complaint about one person.",
            ),
            T(
                "I signed up for a half marathon on October 12th and I currently run about 20 km a week. Can you sketch a 10-week plan?",
                "Here's an outline. Weeks 1-3 build from 20 to 28 km a week, with the Sunday long run growing from 10 to 14 km; week 4 is a cutback to 22 km. Weeks 5-7 build to 36 km with long runs of 15, 17 and 18 km, plus one tempo run of 20-25 minutes each week. Week 8 is the peak: about 38 km with a 19 km long run. Weeks 9 and 10 taper to 28 and then 18 km, keeping a few short race-pace efforts.",
            ),
            T(
                "What does 'amortization' mean?",
                "Amortization means paying off a debt gradually through regular installments that cover both interest and principal. Early payments are mostly interest, and over time more of each payment goes toward the principal, which is why an amortization schedule shows the balance dropping slowly at first and faster near the end. In accounting, the word also describes spreading the cost of an intangible asset, like a patent, over its useful life.",
            ),
            T(
                "How do I change the subtitle language on Netflix on a smart TV?",
                "Start playing the show, then press up or down on the remote to bring up the playback controls and select the speech-bubble icon labelled 'Audio & Subtitles'. Pick the subtitle language from the list. If the language you want isn't there, it's because Netflix only shows a handful of languages per profile; change the profile's display language in your account settings on the website, and more options appear.",
            ),
            T(
                "What are good questions to ask at the end of a job interview?",
                "Ask things that show you're thinking about doing the job well: 'What would success look like in the first six months?', 'What are the biggest challenges the team is facing right now?', and 'How do you see this role evolving?' Asking the interviewer what they enjoy about working there often gets a candid answer. Finish with 'Is there anything about my background that makes you hesitant?' so you can address concerns on the spot.",
            ),
            T(
                "How do I unclog a shower drain without chemicals?",
                "Most shower clogs are hair near the top. Remove the drain cover and pull out what you can with a plastic drain snake or a bent wire hanger. Then pour half a cup of baking soda followed by a cup of vinegar, wait 15 minutes, and flush with a kettle of hot water. If it's still slow, a small hand auger usually reaches deeper clogs. A cheap hair catcher over the drain prevents most repeats.",
            ),
            T(
                "Explain the Monty Hall problem briefly.",
                "You pick one of three doors; one hides a car, two hide goats. The host, who knows where the car is, opens one of the other doors to reveal a goat and offers you a switch. You should switch: your first pick is right only one time in three, so the remaining closed door wins two times in three. The host's knowledge is the key, since he never opens the car door.",
            ),
            T(
                "Any tips for taking better photos of food with my phone?",
                "Shoot near a window with soft daylight coming from the side or behind the plate, and turn off the flash. Try two angles: straight overhead for flat dishes like pizza or bowls, and about 45 degrees for burgers or layered cakes. Clean the lens, tap to focus on the most appetising part, and slightly lower the exposure so colours stay rich. Keep the background simple so the food stands out.",
            ),
            T(
                "What's a good name for a grey kitten?",
                "Some ideas: Smokey, Ash, Pebble, Misty or Storm for classic grey names; Earl Grey or Pepper if you like food names; Luna or Nimbus for something softer; and Gandalf or Graphite if you want a bit of fun. Try saying the name out loud a few times in the voice you'd use to call the kitten for dinner, since that's the real test.",
            ),
        ],
        dep=8,
        final="Quick one about my autumn race prep: how long was the peak long run in that schedule you sketched, and which week is it in?",
        note="Needs the 10-week half-marathon plan: peak long run of 19 km in week 8.",
    )
)

# 6 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-home-kitchen-faucet-part",
        lang="en",
        schema="openai.chat",
        system="You are a helpful assistant for everyday questions.",
        turns=[
            T(
                "My kitchen faucet drips from the spout even when it's fully off. It's a single-handle Moen from around 2012. What's the fix?",
                "On a single-handle Moen of that age, a dripping spout almost always means a worn cartridge, most likely the Moen 1225. Turn off the hot and cold supply valves under the sink, open the faucet to relieve pressure, pry off the handle cap, remove the handle screw and the brass retaining clip, then pull the cartridge straight out with pliers. Note which way the stem faces so hot and cold don't get swapped. A new cartridge costs about $25-40.",
            ),
            T(
                "Can you suggest a three-day itinerary for Mexico City?",
                "Day 1: the Centro Historico, with the Zocalo, the cathedral and Templo Mayor, then lunch at a market and the Palacio de Bellas Artes at sunset. Day 2: Chapultepec Park and the National Museum of Anthropology in the morning, then Roma and Condesa for cafes and dinner. Day 3: an early trip to the Teotihuacan pyramids, back in time for Coyoacan and the Frida Kahlo Museum, which you should book ahead.",
            ),
            T(
                "What's the best way to learn to juggle?",
                "Start with one ball, tossing it from hand to hand in an arc that peaks around eye level, until it's consistent. Then two balls: throw the first, and when it peaks, throw the second underneath it, catch both, and stop. Only move to three once two is smooth, starting with one round of three throws. Practise over a bed so you don't chase dropped balls, and expect it to click after a few days of short sessions.",
            ),
            T(
                "How do I write a SQL query that finds the second highest salary?",
                "The simplest portable version is: SELECT MAX(salary) FROM employees WHERE salary < (SELECT MAX(salary) FROM employees). If you need ties handled cleanly or the Nth highest in general, use a window function: SELECT salary FROM (SELECT salary, DENSE_RANK() OVER (ORDER BY salary DESC) AS r FROM employees) t WHERE r = 2. DENSE_RANK makes sure two people sharing the top salary don't push the real second value to third place.",
            ),
            T(
                "My dog eats way too fast. Any tips?",
                "A slow-feeder bowl with ridges is the easiest fix and usually doubles or triples mealtime. You can also scatter kibble on a snuffle mat or a clean floor, use a food-dispensing toy, or put a large ball in the bowl so he has to eat around it. Splitting his daily food into three smaller meals helps too. Eating too fast can cause vomiting and, in deep-chested breeds, bloat, so it's worth addressing.",
            ),
            T(
                "What's a good book to start reading philosophy?",
                "'Sophie's World' by Jostein Gaarder is a gentle, novel-style tour of Western philosophy. If you prefer straight non-fiction, 'Think' by Simon Blackburn introduces the big questions clearly, and Nigel Warburton's 'A Little History of Philosophy' has short chapters that are easy to read one at a time. For a classic primary text, Marcus Aurelius' 'Meditations' is surprisingly readable and practical.",
            ),
            T(
                "How do I make my resume stand out for a product manager role?",
                "Lead each bullet with an outcome and a number: 'Launched self-serve onboarding that cut time-to-value from 14 to 3 days and lifted activation 18%'. Show the PM range: discovery, prioritisation, working with engineering and design, and measuring results. Tailor the top summary to the company's product area and drop unrelated detail. Keep it to one page if you have under ten years of experience, and link a short portfolio or case study if you have one.",
            ),
            T(
                "How do I politely remind a friend who owes me money?",
                "Keep it light and specific, and give an easy way to pay: 'Hey, hope your week's going well! Just a reminder about the 80 for the concert tickets, no rush, but could you send it by the end of the month? My bank details are the same as before.' Sending a payment request in an app also works and feels less personal. If they've forgotten before, a direct but friendly message is kinder than silent resentment.",
            ),
            T(
                "Explain inflation to a 12-year-old.",
                "Inflation means prices slowly go up over time, so the same amount of money buys a bit less. If a chocolate bar costs 1 today and 1.05 next year, that's 5% inflation. It happens when people want to buy more than shops can supply, or when things like energy get more expensive to produce. A little inflation is normal, but if prices rise very fast, savings lose value and it becomes hard for families to plan.",
            ),
            T(
                "What should I look for when buying a used bicycle?",
                "Check the frame carefully for cracks or dents, especially near welds and the fork. Spin the wheels to see whether they're true and listen for grinding hubs. Look at the chain and cassette for wear; a stretched chain and hooked teeth mean extra cost. Test the brakes and shifting on a short ride, and make sure the size fits you. Ask for a receipt or the serial number to check it isn't stolen.",
            ),
        ],
        dep=0,
        final="About the leaky tap in the kitchen: what part number did you think it was, so I can order it online before the weekend?",
        note="Indirect ('leaky tap' = dripping Moen faucet); needs the first turn's diagnosis: Moen 1225 cartridge.",
    )
)

# 7 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-sql-slow-report-index",
        lang="en",
        schema="openai.chat",
        system="You are an assistant for a backend engineer. You can run read-only SQL against the analytics replica using the run_sql tool.",
        turns=[
            T(
                "Can you rewrite this so it sounds less passive-aggressive: 'As I already mentioned, the deadline is Friday.'",
                "A few friendlier versions: 'Just a reminder that the deadline is Friday.' or 'Quick heads-up: we're aiming to wrap this up by Friday.' If you want to nudge without sounding annoyed, add help: 'The deadline is Friday; let me know if anything's blocking you and I can help.' The trigger phrase is 'as I already mentioned', so dropping it does most of the work.",
            ),
            T(
                "What's a good lunch to meal prep that stays fresh for four days?",
                "Grain bowls hold up well: cook a batch of quinoa or farro, roast chickpeas and sturdy vegetables like sweet potato, broccoli and red onion, and keep a lemon-tahini dressing in a separate jar. Add something crunchy such as toasted seeds on the day. Avoid leafy greens that wilt, or keep them separate. Store each portion in an airtight container, and everything stays good for four days in the fridge.",
            ),
            T(
                "How do I set up SSH keys for GitHub on a new Mac?",
                "Run 'ssh-keygen -t ed25519 -C \"you@example.com\"' and accept the default path, ideally with a passphrase. Start the agent with 'eval \"$(ssh-agent -s)\"' and add the key using 'ssh-add --apple-use-keychain ~/.ssh/id_ed25519'. Copy the public key with 'pbcopy < ~/.ssh/id_ed25519.pub' and paste it into GitHub under Settings > SSH and GPG keys. Test with 'ssh -T git@github.com'.",
            ),
            T(
                "In the US, how is capital gains tax different if I sell stock I've held for 11 months versus 13 months?",
                "At 11 months the gain is short-term and taxed as ordinary income, at your regular bracket, which can be up to 37% federally. After more than one year it becomes a long-term gain, taxed at 0%, 15% or 20% depending on your income, and most people land in the 15% bracket. So waiting a couple of months can save a lot on a large gain, as long as the price doesn't drop in the meantime.",
            ),
            TOOL(
                "The monthly revenue report query is taking around 40 seconds. Can you run EXPLAIN ANALYZE on it?",
                [
                    (
                        "run_sql",
                        {
                            "query": "EXPLAIN ANALYZE SELECT date_trunc('month', o.created_at) AS m, sum(o.total) FROM orders o WHERE o.customer_id = 4821 AND o.created_at >= '2024-01-01' GROUP BY 1"
                        },
                        "GroupAggregate  (cost=1843290.12..1843294.62 rows=12 width=40) (actual time=39812.4..39812.9 rows=12 loops=1)\n  ->  Sort  (cost=1843290.12..1843290.65 rows=212 width=16) (actual time=39812.1..39812.2 rows=198 loops=1)\n        ->  Seq Scan on orders o  (cost=0.00..1843211.00 rows=212 width=16) (actual time=12.1..39790.2 rows=198 loops=1)\n              Filter: ((created_at >= '2024-01-01') AND (customer_id = 4821))\n              Rows Removed by Filter: 48213377\nPlanning Time: 0.31 ms\nExecution Time: 39813.1 ms",
                    )
                ],
                "The plan shows a sequential scan over the entire orders table: Postgres reads about 48.2 million rows and discards all but 198 of them, which accounts for nearly all of the 39.8 seconds. There's no usable index for the customer_id and created_at filter, and the grouping itself is trivial at 12 output rows. So the fix is purely about the access path, not the aggregation.",
            ),
            T(
                "Suggest some gentle yoga poses for before bed.",
                "Try legs-up-the-wall for three to five minutes, which is very calming; a supported child's pose with a pillow under your chest; a reclined bound angle pose with the soles of your feet together; and a gentle seated forward fold. Finish with a lying twist on each side and a couple of minutes in corpse pose with slow exhales longer than your inhales. Keep the lights low and skip anything strenuous.",
            ),
            T(
                "What's a good gift for a coworker who's retiring?",
                "Think about what they'll do next: a nice guidebook and travel journal if they plan to travel, good gardening tools, or a class in something they've mentioned, like pottery or cooking. A memory book with notes from colleagues is cheap and often the most treasured. For a group gift, a quality item they'd never buy themselves, like a good pair of binoculars or a luxury hamper, works well.",
            ),
            T(
                "How do I explain a gap year on my CV?",
                "Be brief and matter-of-fact, and frame it around what you did: 'Career break, 2023: travelled through South America, completed a Spanish B2 course and a Google Data Analytics certificate.' If it was for caregiving or health, 'Career break for family reasons' is enough; you don't owe details. In interviews, spend one sentence on the gap and move to why you're excited about the role now.",
            ),
            T(
                "My toddler refuses vegetables. Any strategies that actually work?",
                "Keep offering without pressure: it can take 10-15 exposures before a child accepts a new food. Put a small portion of a vegetable next to something they already like, and eat it yourself where they can see. Let them help wash or choose vegetables at the shop, and try different textures such as roasted, raw with a dip or blended into a sauce. Avoid bribing with dessert, which teaches that vegetables are the chore.",
            ),
            T(
                "How do I configure Prettier to use single quotes?",
                'Add a config file in the project root, for example .prettierrc, with {"singleQuote": true}. If you also want it in JSX, set "jsxSingleQuote": true. Restart your editor or reload the Prettier extension so it picks up the change, and run \'npx prettier --write .\' once to reformat existing files. If ESLint also enforces quotes, use eslint-config-prettier to turn off conflicting rules.',
            ),
            T(
                "What's the best way to store winter clothes so moths don't get them?",
                "Wash or dry-clean everything first, because moths are attracted to body oils and food traces. Store items in airtight plastic boxes or vacuum bags rather than cardboard. Add cedar blocks or lavender sachets, refreshing cedar with sandpaper each season. Keep the storage area cool and dark, and check once mid-season. If you've already seen moths, freezing wool items for 72 hours kills any eggs.",
            ),
            T(
                "Give me a quick overview of the causes of the French Revolution.",
                "The main causes were a deep financial crisis, since France was nearly bankrupt after wars including support for the American Revolution; an unfair tax system where the clergy and nobility paid little; and rising bread prices after poor harvests. Enlightenment ideas about rights and popular sovereignty spread widely. When Louis XVI called the Estates-General in 1789 to raise taxes, the Third Estate broke away to form a National Assembly.",
            ),
            T(
                "How do I calculate a 15% tip quickly in my head?",
                "Take 10% by moving the decimal point one place left, then add half of that. For a 64 dollar bill: 10% is 6.40, half of that is 3.20, so 15% is 9.60. Rounding the bill first makes it even easier; 65 gives 6.50 plus 3.25, about 9.75. For 20%, just double the 10% figure.",
            ),
        ],
        dep=4,
        final="Back to that 40-second report: based on the plan you pulled, what index would you create, and should created_at be part of it?",
        note="Needs the EXPLAIN ANALYZE tool output: seq scan on orders filtering customer_id = 4821 and created_at, 48M rows removed -> composite index (customer_id, created_at).",
    )
)

# 8 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-lang-spanish-ojala",
        lang="en",
        schema="anthropic.messages",
        blocks=True,
        system="You are a patient language tutor and general-purpose assistant.",
        turns=[
            T(
                "How do I cancel a gym membership that insists on a written letter?",
                "Send a short, dated letter with your full name, membership number and address, stating: 'I am writing to cancel my membership effective immediately' or on the date your contract allows. Ask them to confirm in writing and stop all future payments. Send it by recorded or certified mail and keep the receipt and a copy. If they keep charging you, dispute the payments with your bank and include that proof.",
            ),
            T(
                "Do you have a simple tomato soup recipe using canned tomatoes?",
                "Soften a chopped onion and two garlic cloves in butter or olive oil for about eight minutes. Add two 400 g cans of tomatoes, 500 ml of vegetable stock, a teaspoon of sugar and a pinch of chilli flakes, then simmer for 20 minutes. Blend until smooth, season with salt and pepper, and stir in a splash of cream if you like. A handful of fresh basil at the end lifts it a lot.",
            ),
            T(
                "What's the difference between RAM and storage, in simple terms?",
                "RAM is your computer's desk: it holds whatever you're working on right now, it's very fast, and it's cleared when you switch off. Storage, like an SSD or hard drive, is the filing cabinet: slower, but much larger and it keeps everything when the power is off. More RAM lets you keep more apps and tabs open smoothly, while more storage lets you keep more files, photos and programs.",
            ),
            T(
                "Can you help me plan a surprise 40th birthday party on a budget?",
                "Host it at home or in a park to skip venue costs, and make it a potluck with you providing a centrepiece dish and the cake. Use a shared group chat, not social media, for invitations, and recruit one close friend to get the birthday person there at the right time. A photo wall of pictures from the last 40 years makes great, nearly free decoration. Budget the most for drinks and one good cake.",
            ),
            T(
                "How do I get a red wine stain out of a carpet?",
                "Act fast and blot, don't rub, with a clean cloth to soak up as much as possible. Pour a little cold water on the stain and blot again. Then mix a tablespoon of dish soap and a tablespoon of white vinegar in two cups of warm water, sponge it on, and keep blotting. For a stubborn stain on a light carpet, hydrogen peroxide mixed with a drop of dish soap works, but test a hidden spot first.",
            ),
            T(
                "What are good stretches for tight hamstrings?",
                "A standing hamstring stretch with one heel on a low step and a straight back is a good start, and a lying version with a strap or towel around the foot is easier to control. Add a seated forward fold and a 'downward dog' with alternating heel pedals. Hold each for 30-45 seconds and breathe slowly; don't bounce. Doing it daily for a few weeks matters more than stretching hard.",
            ),
            T(
                "In Spanish, why is it 'ojalá que llueva' and not 'ojalá que llueve'?",
                "'Ojalá' expresses a wish or hope, and in Spanish wishes about things you don't control take the subjunctive, so you need 'llueva', the present subjunctive, rather than the indicative 'llueve'. The word comes from the Arabic 'law sha' Allah', roughly 'if God wills', which is why it never conjugates. You can drop the 'que': 'Ojalá llueva mañana.' For wishes that are unlikely or contrary to fact, switch to the imperfect subjunctive: 'Ojalá lloviera.'",
            ),
            T(
                "What's the best way to back up photos from my phone?",
                "Use two copies in different places. Turn on automatic cloud backup, such as iCloud Photos or Google Photos, so new pictures are saved without you thinking about it. Then, every few months, export the full-resolution originals to an external drive or your computer. Check your cloud settings are backing up originals, not compressed versions, and that the backup actually completes over Wi-Fi.",
            ),
            T(
                "Explain compound interest with an example.",
                "Compound interest means you earn interest on your interest. Put 1,000 in an account paying 5% a year: after year one you have 1,050. In year two you earn 5% on 1,050, which is 52.50, so you have 1,102.50. After 10 years it's about 1,629, and after 30 years about 4,322, even though you never added anything. Time is the biggest factor, which is why starting early matters so much.",
            ),
            T(
                "Suggest a title for a fantasy novel about a lighthouse keeper.",
                "Some ideas: 'The Keeper of the Last Light', 'Salt and Lantern', 'Where the Tide Remembers', 'The Lamp at the Edge of the World', or 'A Light for Drowned Kings'. If the story leans darker, 'The Beacon Hungers' has a nice eerie ring. A good fantasy title often pairs one concrete object with one mysterious idea, so try combining an image from your story with its central secret.",
            ),
            T(
                "How do I politely leave a group chat?",
                "If it's a friendly group, a quick note before leaving avoids confusion: 'Hi all, I'm trimming my notifications so I'm going to step out of this chat. Feel free to message me directly anytime!' For work chats, mention who to contact instead. If leaving would cause drama, muting the chat indefinitely is a perfectly good alternative that nobody can see.",
            ),
            T(
                "What's a good daily routine for learning guitar chords?",
                "Spend 15-20 minutes a day. Warm up for two minutes with finger exercises, then practise two chords at a time, switching back and forth slowly for a minute without strumming, focusing on moving all fingers together. Next strum a simple pattern while changing chords on the beat. Finish by playing a song you like that uses those chords. Start with G, C, D and Em, since thousands of songs use just those four.",
            ),
        ],
        dep=6,
        final="That Spanish wish word with the Arabic roots: could you give me two more example sentences with it, one of them about something that probably won't happen?",
        note="Indirect reference to 'ojalá'; needs that turn's rule (present subjunctive for hopes, imperfect subjunctive for unlikely wishes).",
    )
)

# 9 ---------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-cooking-sourdough-wholewheat",
        lang="en",
        schema="openai.chat",
        system=None,
        turns=[
            T(
                "How do I make a pivot table in Google Sheets?",
                "Select your data including the header row, then go to Insert > Pivot table and choose a new sheet. In the editor on the right, add a field under Rows, for example Region, and a field under Values, for example Sales, which defaults to SUM. You can add Columns for a second dimension and Filters to narrow it down. The pivot updates automatically when the source data changes, as long as new rows fall inside the selected range.",
            ),
            T(
                "What's a good way to start journaling?",
                "Keep it tiny so it sticks: three lines at the end of the day about what happened, how you felt, and one thing you're grateful for. Leave the notebook somewhere visible, like on your pillow. If you get stuck, use prompts such as 'What drained me today?' or 'What do I want tomorrow to look like?' Don't reread or edit for the first month; the habit matters more than the writing.",
            ),
            T(
                "Can you give me a 30-minute bodyweight workout?",
                "Warm up for five minutes with jumping jacks, arm circles and leg swings. Then do four rounds of: 12 squats, 10 push-ups (on knees if needed), 12 reverse lunges per leg, a 40-second plank and 15 glute bridges, resting about a minute between rounds. Finish with five minutes of stretching. To make it harder over the weeks, slow down each rep or add a fifth round.",
            ),
            T(
                "What are signs that my car battery is dying?",
                "The classic signs are a slow, sluggish crank when you start the engine, dim headlights at idle, a battery warning light on the dashboard, and electrical glitches like the radio resetting. Corrosion on the terminals or a swollen battery case are also red flags. Most batteries last three to five years, so if yours is older, ask a garage to test it; many do it free.",
            ),
            T(
                "Should I use a VPN on public Wi-Fi?",
                "It's a reasonable precaution, although less critical than it used to be, because most websites and apps already encrypt traffic with HTTPS. A VPN hides which sites you visit from the network operator and protects any apps that don't encrypt properly. If you use one, choose a reputable paid provider, since free ones often log or sell data. Also turn off automatic joining of open networks on your phone.",
            ),
            T(
                "How do I repot an orchid?",
                "Repot after it finishes blooming, roughly every two years. Gently remove it from the pot, soak the roots for ten minutes, and trim any that are brown, mushy or papery with clean scissors; healthy roots are firm and green or silver. Place it in a slightly larger pot with drainage holes using orchid bark, not normal soil, and tuck the bark in around the roots. Wait about a week before watering.",
            ),
            T(
                "What's the plot of Hamlet in five sentences?",
                "Prince Hamlet of Denmark learns from his father's ghost that his uncle Claudius murdered the king and married his mother, Gertrude. Hamlet pretends to be mad while he tests the ghost's claim, staging a play that mirrors the murder. He accidentally kills Polonius, whose daughter Ophelia goes mad and drowns. Polonius' son Laertes duels Hamlet with a poisoned sword. By the end nearly everyone is dead, including Hamlet, who finally kills Claudius.",
            ),
            T(
                "How do I set up a budget with the 50/30/20 rule?",
                "Start with your monthly take-home pay. Put 50% toward needs such as rent, utilities, groceries, insurance and minimum debt payments; 30% toward wants like dining out, hobbies and subscriptions; and 20% toward savings and extra debt repayment. Track a month of spending to see where you actually are, then adjust. If your needs exceed 50% because of high rent, take it from the wants category first.",
            ),
            T(
                "What's the fastest way to learn Japanese hiragana?",
                "Use mnemonic images, like those in the Tofugu guide, which link each character to a picture; most people learn all 46 in a week this way. Study five to ten characters a day, then drill them with a spaced-repetition app such as Anki. Start reading simple words straight away rather than only drilling single characters, and write each one by hand a few times to lock it in.",
            ),
            T(
                "Help me write a LinkedIn post announcing my new job.",
                "Here's a draft: 'Some personal news: I've joined Brightline as a Senior Product Designer! I'll be working on tools that help small clinics manage patient scheduling, a problem I've cared about for years. Huge thanks to my former teammates at Kestrel for three brilliant years, and to everyone who helped along the way. Excited for what's next!' Keep it short, mention what you'll work on, and thank people.",
            ),
            T(
                "I want to bake my first sourdough loaf this weekend. Can you give me a simple recipe with timings?",
                "Here's a 75% hydration loaf: 500 g bread flour, 375 g water, 100 g active starter and 10 g salt. Mix the flour with 350 g of the water and rest 45 minutes, then add the starter, salt and remaining 25 g water. Do four sets of stretch-and-folds 30 minutes apart, then bulk ferment until the dough has grown about 50%, usually 4-6 hours at 24 C. Shape, refrigerate overnight in a floured banneton, and bake in a preheated Dutch oven at 250 C for 20 minutes lid on, then 20-25 minutes lid off at 230 C.",
            ),
            T(
                "How do I fix 'Permission denied (publickey)' when pushing to GitHub?",
                "It means GitHub didn't accept any SSH key you offered. Run 'ssh -T git@github.com' to confirm, then check a key exists in ~/.ssh and is loaded with 'ssh-add -l'. If not, add it with 'ssh-add ~/.ssh/id_ed25519'. Make sure the matching .pub key is added in your GitHub account settings, and that the remote URL starts with git@github.com rather than an HTTPS address that expects a token.",
            ),
            T(
                "What wine would go with mushroom risotto?",
                "Earthy mushrooms love Pinot Noir, whose light body and forest-floor notes match without overpowering the rice. If you prefer white, an oaked Chardonnay or a white Burgundy complements the creaminess, and a dry Italian white like Soave or Verdicchio keeps it fresh. If you finished the risotto with a lot of Parmesan, a Barbera or Nebbiolo works nicely too.",
            ),
            T(
                "How do I teach my dog to stop pulling on the leash?",
                "Stop moving the moment the leash goes tight, and only walk forward again when it slackens; he learns that pulling gets him nowhere. Reward him with a treat when he's walking beside you, very often at first. Changing direction unpredictably keeps his attention on you. Short, frequent training walks beat one long frustrating one, and a front-clip harness reduces pulling while you train.",
            ),
            T(
                "What's the difference between a latte and a flat white?",
                "Both are espresso with steamed milk, but a flat white is smaller, usually around 160-180 ml, with a double shot, so it tastes stronger. Its milk is steamed to a thin, velvety microfoam that blends into the coffee. A latte is bigger, with more milk and a slightly thicker layer of foam on top, so it's milder and creamier. Cafes vary a lot, so the same name can mean different drinks in different places.",
            ),
            T(
                "How can I reduce my electricity bill in summer?",
                "Set the air conditioning around 24-26 C and use fans, which use far less power, to feel cooler. Close blinds on sunny windows during the day and open windows at night if it cools down. Clean or replace the AC filter, since a clogged one makes it work harder. Run the dishwasher and washing machine in the evening, and unplug devices on standby. Switching to LED bulbs also reduces heat in the room.",
            ),
            T(
                "Give me a mnemonic for the Great Lakes.",
                "The classic one is HOMES: Huron, Ontario, Michigan, Erie and Superior. If you need them in order from west to east, try 'Super Man Helps Every One': Superior, Michigan, Huron, Erie, Ontario. Superior is the largest and deepest, and Ontario the smallest by surface area.",
            ),
            T(
                "Which is better for a beginner: Python or JavaScript?",
                "Python is usually easier to start with because its syntax is clean and reads almost like English, and it's great for automation, data work and general programming. JavaScript is the language of the web, so it's the better pick if your goal is to build websites or interactive pages quickly. Either is fine; the concepts transfer. Pick the one tied to a project you actually want to build.",
            ),
        ],
        dep=10,
        final="For the bread you walked me through before, if I swap 20% of the flour for whole wheat, how much extra water should I add?",
        note="Needs the sourdough recipe: 500 g flour, 375 g water (75% hydration), so 100 g whole wheat and roughly 10-20 g extra water.",
    )
)
